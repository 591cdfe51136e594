// sigsafe_inflight PORT OP ACT RESTART: the SIGALRM handler does ACT (close|shut|dup2) on the connection the
// main thread is blocked on in OP (recv|read|send|poll|epoll|select); prints what OP returned.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <errno.h>
#include <time.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
static int fd, devnull; static const char *act;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static void h(int s){(void)s; int e=errno; if(!strcmp(act,"dup2")) dup2(devnull,fd); else if(!strcmp(act,"shut")) shutdown(fd,SHUT_RDWR); else close(fd); errno=e;}
int main(int argc,char**argv){
  int port=atoi(argv[1]); const char*op=argv[2]; act=argv[3]; int restart=atoi(argv[4]); devnull=open("/dev/null",O_RDWR);
  setvbuf(stdout,0,_IONBF,0);
  int l=socket(AF_INET,SOCK_STREAM,0); int one=1; setsockopt(l,SOL_SOCKET,SO_REUSEADDR,&one,sizeof one);
  struct sockaddr_in a={.sin_family=AF_INET,.sin_port=htons(port),.sin_addr.s_addr=htonl(INADDR_LOOPBACK)};
  bind(l,(void*)&a,sizeof a); listen(l,8);
  pid_t sp=fork();
  if(!sp){int c=accept(l,0,0); write(c,"hello",5); sleep(3); char b[1<<16]; long tot=0,n; struct pollfd q={c,POLLIN,0}; while(poll(&q,1,500)>0 && (n=read(c,b,sizeof b))>0) tot+=n; printf("server: read %ld then %s\n",tot, n==0?"EOF":strerror(errno)); _exit(0);}
  close(l);
  fd=socket(AF_INET,SOCK_STREAM,0); connect(fd,(void*)&a,sizeof a); char b[65536]; recv(fd,b,5,MSG_WAITALL);
  struct sigaction sa; memset(&sa,0,sizeof sa); sa.sa_handler=h; sa.sa_flags=restart?SA_RESTART:0; sigaction(SIGALRM,&sa,0);
  struct itimerval it={{0,0},{0,200000}}; setitimer(ITIMER_REAL,&it,0);
  double t0=now(); long r; int e;
  if(!strcmp(op,"recv")) r=recv(fd,b,100,0);
  else if(!strcmp(op,"read")) r=read(fd,b,100);
  else if(!strcmp(op,"send")) { long tot=0; memset(b,'x',sizeof b); do { r=send(fd,b,sizeof b,MSG_NOSIGNAL); if(r>0) tot+=r; } while(r>0 && now()-t0<5); printf("sent %ld before: ",tot>0); }
  else if(!strcmp(op,"poll")) { struct pollfd q={fd,POLLIN,0}; r=poll(&q,1,3000); if(r>0) printf("revents=%#x ",q.revents); }
  else if(!strcmp(op,"epoll")) { int ep=epoll_create1(0); struct epoll_event ev={.events=EPOLLIN,.data.fd=fd}; epoll_ctl(ep,EPOLL_CTL_ADD,fd,&ev); struct epoll_event o; r=epoll_wait(ep,&o,1,3000); if(r>0) printf("events=%#x ",o.events); }
  else { fd_set s; FD_ZERO(&s); FD_SET(fd,&s); struct timeval tv={3,0}; r=select(fd+1,&s,0,0,&tv); }
  e=errno;
  printf("%s %s restart=%d: r=%ld %s after %.1f s\n",op,act,restart,r,r<0?strerror(e):"",now()-t0);
  int st; waitpid(sp,&st,0);
  return 0;
}
