#!/bin/bash
# rt18_setup.sh: the scratch tree of round 18 in /tmp/trial (ssh keys and configs, the 200 MB
# and 50 MB random files, the rsync source tree and config, inetd helpers, lighttpd/tinyproxy
# configs and a bare git repository). Needs openssh-server, rsync, openbsd-inetd, lighttpd,
# tinyproxy, socat, curl, git. Remove with `rm -rf /tmp/trial`.
set -eu
T=/tmp/trial; H=$(cd "$(dirname "$0")" && pwd)
mkdir -p $T/ssh $T/rs/src $T/rs/mod $T/inetd $T/misc/www/cgi-bin $T/misc/git $T/misc/log /run/sshd
chmod o+rx $T $T/misc
cd $T/ssh
[ -f hostkey ] || ssh-keygen -q -t ed25519 -N '' -f hostkey
[ -f userkey ] || ssh-keygen -q -t ed25519 -N '' -f userkey
cp userkey.pub authorized_keys
cat > sshd_config <<EOC
Port 43022
ListenAddress 127.0.0.1
HostKey $T/ssh/hostkey
AuthorizedKeysFile $T/ssh/authorized_keys
PermitRootLogin yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $T/ssh/sshd.pid
Subsystem sftp /usr/lib/openssh/sftp-server
AllowTcpForwarding yes
MaxStartups 100:30:200
MaxSessions 50
EOC
cat > ssh_config <<EOC
Host t
  HostName 127.0.0.1
  Port 43022
  User root
  IdentityFile $T/ssh/userkey
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  BatchMode yes
  LogLevel ERROR
EOC
[ -f $T/big.bin ] || head -c 200M /dev/urandom > $T/big.bin
head -c 50M $T/big.bin > $T/50m.bin
[ -d $T/rs/src/inc ] || cp -r /usr/include $T/rs/src/inc
cp $T/big.bin $T/rs/src/
cat > $T/rs/rsyncd.conf <<EOC
pid file = $T/rs/rsyncd.pid
lock file = $T/rs/rsyncd.lock
port = 43873
address = 127.0.0.1
max connections = 100
[m]
  path = $T/rs/mod
  read only = no
  uid = nobody
  gid = nogroup
  use chroot = yes
EOC
cp $H/rt18_inetd_wait.py $T/inetd/waitsrv.py
cp $H/rt18_inetd_svc.sh $T/inetd/svc.sh
cp $T/50m.bin $T/misc/www/
printf '#!/bin/sh\necho "Content-Type: text/plain"\necho\necho "q=$QUERY_STRING"\nif [ "$REQUEST_METHOD" = POST ]; then sha256sum | cut -c1-16; fi\n' > $T/misc/www/cgi-bin/t.cgi
chmod +x $T/misc/www/cgi-bin/t.cgi; chmod -R o+rX $T/misc/www; chown www-data $T/misc/log
cat > $T/misc/lighttpd.conf <<EOC
server.document-root = "$T/misc/www"
server.port = 43180
server.bind = "127.0.0.1"
server.modules = ("mod_cgi")
cgi.assign = (".cgi" => "")
server.errorlog = "$T/misc/log/lighttpd.err"
server.username = "www-data"
server.groupname = "www-data"
EOC
cat > $T/misc/tinyproxy.conf <<EOC
Port 43188
Listen 127.0.0.1
Timeout 60
MaxClients 50
Allow 127.0.0.1
LogLevel Info
LogFile "$T/misc/tinyproxy.log"
EOC
if [ ! -d $T/misc/git/r.git ]; then
  git init -q --bare $T/misc/git/r.git
  rm -rf $T/misc/wsrc; git clone -q $T/misc/git/r.git $T/misc/wsrc 2>/dev/null
  cp -r /usr/include/linux $T/misc/wsrc/; head -c 20M $T/big.bin > $T/misc/wsrc/blob.bin
  git -C $T/misc/wsrc add -A
  git -C $T/misc/wsrc -c user.email=a@b -c user.name=t commit -qm init
  git -C $T/misc/wsrc push -q origin HEAD:master
fi
