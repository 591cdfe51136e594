#!/usr/bin/perl
# Round 13: Perl servers and clients, checked byte for byte (run under world.sh smc|tcp).
# usage: perl rt13_perl.pl PORT MODE N
#   inetd     fork-per-connection server (SIGCHLD reaper, accept retried on EINTR); the child
#             does open(STDIN, "<&", $sock), open(STDOUT, ">&", $sock) and execs sha256sum.
#   inetd_nolib  the same, the child execs `env -u LD_PRELOAD sha256sum` (no library).
#   select    an IO::Select echo server in one process, N clients (forked) of 100 KB each.
#   cexec     the client forks, the child execs `env -u LD_PRELOAD sleep 0.3` with the socket as
#             stdin (a copy of the client end leaves for an image without the library) while the
#             parent sends and reads the server's digest, then waits for it with waitpid($pid, 0).
use strict; use warnings;
use IO::Socket::INET; use IO::Select; use POSIX ":sys_wait_h"; use Digest::SHA qw(sha256_hex);
$| = 1;
my ($port, $mode, $n) = @ARGV; $n //= 20;
sub data { my $k = shift; srand($k); my $len = 1 + int(rand(200000)); join('', map { chr(int(rand(256))) } 1..$len) }
my $l = IO::Socket::INET->new(LocalAddr => "127.0.0.1", LocalPort => $port, Listen => 64, ReuseAddr => 1) or die "listen: $!";
my $srv = fork();
if (!$srv) {
  $SIG{CHLD} = sub { 1 while waitpid(-1, WNOHANG) > 0 };
  if ($mode eq 'select') {
    my $sel = IO::Select->new($l);
    while (1) {
      for my $s ($sel->can_read) {
        if ($s == $l) { my $c = $l->accept or next; $sel->add($c); next }
        my $r = sysread($s, my $buf, 65536);
        if (!$r) { $sel->remove($s); close $s; next }
        my $off = 0; while ($off < $r) { my $w = syswrite($s, $buf, $r - $off, $off); die "write: $!" unless defined $w; $off += $w }
      }
    }
  }
  while (1) {
    my $c = $l->accept;
    if (!$c) { next if $!{EINTR}; die "accept: $!" }
    my $pid = fork();
    if (!$pid) {
      if ($mode eq 'cexec') {  # plain echo-digest server: read to EOF, answer the digest
        local $/; my $d = <$c>; print $c sha256_hex($d), "\n"; exit 0;
      }
      open(STDIN, "<&", $c) or die; open(STDOUT, ">&", $c) or die; close $c;
      my @cmd = $mode eq 'inetd_nolib' ? ('env', '-u', 'LD_PRELOAD', 'sha256sum') : ('sha256sum');
      exec @cmd or die "exec: $!";
    }
    close $c;
  }
}
close $l;
my ($ok, $bad) = (0, 0);
my @kids;
for my $k (1..$n) {
  my $p = fork();
  if (!$p) {
    my $d = data($k);
    my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1", PeerPort => $port) or die "connect: $!";
    my $want = sha256_hex($d);
    my $got;
    if ($mode eq 'select') {
      my $w = fork();
      if (!$w) { syswrite($s, $d) == length($d) or die; shutdown($s, 1); exit 0 }
      my $in = ''; my $want_len = length($d);
      while (length($in) < $want_len) { my $r = sysread($s, $in, 65536, length $in); last unless $r }
      waitpid($w, 0);
      $got = sha256_hex($in);
    } elsif ($mode eq 'cexec') {
      my $c = fork();
      if (!$c) { open(STDIN, "<&", $s) or die; close $s; exec('env', '-u', 'LD_PRELOAD', 'sleep', '0.3') or die }
      syswrite($s, $d) == length($d) or die "write: $!";
      shutdown($s, 1);
      local $/; $got = <$s>; $got //= ''; ($got) = split /\s/, $got;
      waitpid($c, 0);
    } else {
      syswrite($s, $d) == length($d) or die "write: $!";
      shutdown($s, 1);
      local $/; $got = <$s>; $got //= ''; ($got) = split / /, $got;
    }
    $got //= '';
    if ($got eq $want) { exit 0 }
    print "client $k: got '", substr($got, 0, 70), "'\n"; exit 1;
  }
  push @kids, $p;
  if (@kids >= 8) { waitpid(shift @kids, 0); $? == 0 ? $ok++ : $bad++ }
}
for (@kids) { waitpid($_, 0); $? == 0 ? $ok++ : $bad++ }
print "$mode: $ok of $n right, $bad wrong\n";
kill 'KILL', $srv; waitpid($srv, 0);
