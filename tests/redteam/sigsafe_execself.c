// sigsafe_execself PORT K LIB: K connections to a forked server; a SIGALRM handler (while main churns
// malloc) sends BYE on each and execve()s /bin/sleep 1 directly (LIB=1 keeps LD_PRELOAD, 0 drops it).
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
static int K, fds[100], lib; static char **env;
static char *const nolib[] = {"PATH=/bin:/usr/bin", NULL};
static void h(int s){(void)s; for(int i=0;i<K;i++) send(fds[i],"BYE\n",4,MSG_NOSIGNAL); char*av[]={"/bin/sleep","1",0}; execve("/bin/sleep",av,lib?env:nolib); _exit(99);}
int main(int argc,char**argv,char**envp){
  int port=atoi(argv[1]); K=atoi(argv[2]); lib=atoi(argv[3]); env=envp; setvbuf(stdout,0,_IONBF,0);
  int l=socket(AF_INET,SOCK_STREAM,0); int one=1; setsockopt(l,SOL_SOCKET,SO_REUSEADDR,&one,sizeof one);
  struct sockaddr_in a={.sin_family=AF_INET,.sin_port=htons(port),.sin_addr.s_addr=htonl(INADDR_LOOPBACK)};
  bind(l,(void*)&a,sizeof a); listen(l,128);
  pid_t sp=fork();
  if(!sp){int c[100]; for(int i=0;i<K;i++){c[i]=accept(l,0,0); write(c[i],"hello",5);} int ok=0; for(int i=0;i<K;i++){char b[64]; int n,t=0; char acc[64]; while((n=read(c[i],b,sizeof b))>0){ if(t+n<64) memcpy(acc+t,b,n); t+=n;} if(t==4&&!memcmp(acc,"BYE\n",4)&&n==0) ok++;} printf("server: exact=%d of %d\n",ok,K); _exit(0);}
  close(l);
  for(int i=0;i<K;i++){fds[i]=socket(AF_INET,SOCK_STREAM,0); connect(fds[i],(void*)&a,sizeof a); char b[5]; recv(fds[i],b,5,MSG_WAITALL);}
  signal(SIGALRM,h); struct itimerval it={{0,0},{0,50000}}; setitimer(ITIMER_REAL,&it,0);
  static void*s[256]; unsigned r=1; for(;;){r=r*1103515245+12345; int j=(r>>8)%256; free(s[j]); s[j]=malloc((r>>4)%100000+1);}
}
