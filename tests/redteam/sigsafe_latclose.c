// sigsafe_latclose PORT MODE: the handler sends BYE and closes (MODE close|dup2); main spins 2 s without calls.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <time.h>
#include <fcntl.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/syscall.h>
static int fd, devnull; static const char *mode;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static void h(int s){(void)s; send(fd,"BYE\n",4,MSG_NOSIGNAL); if(!strcmp(mode,"dup2")) dup2(devnull,fd); else close(fd);}
int main(int argc,char**argv){
  int port=atoi(argv[1]); mode=argv[2]; devnull=open("/dev/null",O_RDWR);
  int l=socket(AF_INET,SOCK_STREAM,0); int one=1; setsockopt(l,SOL_SOCKET,SO_REUSEADDR,&one,sizeof one);
  struct sockaddr_in a={.sin_family=AF_INET,.sin_port=htons(port),.sin_addr.s_addr=htonl(INADDR_LOOPBACK)};
  bind(l,(void*)&a,sizeof a); listen(l,8);
  pid_t sp=fork();
  if(!sp){int c=accept(l,0,0); write(c,"hello",5); char b[64]; double tb=0; long n; 
    while((n=read(c,b,sizeof b))>0){ if(!tb) tb=now(); }
    printf("server: EOF %.0f ms after BYE (read returned %ld)\n",(now()-tb)*1000,n); fflush(stdout); _exit(0);}
  close(l);
  fd=socket(AF_INET,SOCK_STREAM,0); connect(fd,(void*)&a,sizeof a); char b[5]; recv(fd,b,5,MSG_WAITALL);
  signal(SIGALRM,h); struct itimerval it={{0,0},{0,100000}}; setitimer(ITIMER_REAL,&it,0);
  double t0=now(); volatile unsigned long x=0; while(now()-t0<2.0) x++;
  int st; syscall(SYS_wait4, sp, &st, 0, 0);
  sleep(0); // no library call; exit
  _exit(0);
}
