#!/usr/bin/perl
# Red-team round 27: Perl's timeout idioms around connections of the data path: alarm + die
# out of a blocking sysread/readline (Perl's deferred signals: the read must end with EINTR),
# IO::Socket's Timeout, IO::Select, then the connection used on. Run with and without the
# library (world.sh tcp|smc perl rt27_perl.pl) and diff.
use strict;
use warnings;
use IO::Socket::INET;
use IO::Select;
$| = 1;
my $l = IO::Socket::INET->new(Listen => 5, LocalAddr => '127.0.0.1', LocalPort => 0, ReuseAddr => 1) or die "listen: $!";
my $port = $l->sockport;
my $pid = fork() // die;
if ($pid == 0) {
    # The server: each connection: wait for "go\n", answer "late\n" 1.5 s later, echo lines.
    while (my $a = $l->accept) {
        while (defined(my $line = <$a>)) {
            if ($line eq "go\n") { select(undef, undef, undef, 1.5); print $a "late\n"; }
            elsif ($line eq "bye\n") { last; }
            else { print $a "echo $line"; }
        }
        close $a;
    }
    exit 0;
}
close $l;
sub conn { IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die "connect: $!" }

# 1. alarm + die out of sysread, then the late answer read on the same connection.
{
    my $s = conn();
    print $s "go\n";
    my $buf = '';
    my $r = eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm 1;
        my $n = sysread($s, $buf, 100);
        alarm 0;
        "read $n";
    };
    print "sysread alarm: ", ($r // "died: $@");
    print "\n" if defined $r;
    my $n = sysread($s, $buf, 100);
    print "then: $n $buf";
    print $s "bye\n";
    close $s;
}
# 2. alarm + die out of readline.
{
    my $s = conn();
    print $s "go\n";
    my $r = eval {
        local $SIG{ALRM} = sub { die "timeout\n" };
        alarm 1;
        my $line = <$s>;
        alarm 0;
        "line $line";
    };
    print "readline alarm: ", ($r // "died: $@");
    my $line = <$s>;
    print "then: $line";
    print $s "hello\n";
    $line = <$s>;
    print "echo: $line";
    print $s "bye\n";
    close $s;
}
# 3. A handler that returns (no die): Perl restarts the read (SA_RESTART is not set; Perl
# loops on EINTR in readline but sysread returns undef with EINTR).
{
    my $s = conn();
    print $s "go\n";
    my $fired = 0;
    local $SIG{ALRM} = sub { $fired++ };
    alarm 1;
    my $buf = '';
    my $n = sysread($s, $buf, 100);
    alarm 0;
    print "sysread handler returns: ", (defined $n ? "read $n $buf" : "undef $!\n");
    print "fired $fired\n";
    $n = sysread($s, $buf, 100) unless defined $n;
    print "then: ", (defined $n ? "$n $buf" : "undef $!\n");
    print $s "bye\n";
    close $s;
}
# 4. IO::Select with a timeout, then the data.
{
    my $s = conn();
    print $s "go\n";
    my $sel = IO::Select->new($s);
    my @r = $sel->can_read(0.5);
    print "select early: ", scalar(@r), "\n";
    @r = $sel->can_read(5);
    print "select later: ", scalar(@r), "\n";
    my $line = <$s>;
    print "line: $line";
    print $s "bye\n";
    close $s;
}
# 5. IO::Socket's Timeout on connect and a 200-line echo.
{
    my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 3) or die;
    my $ok = 0;
    for my $i (1 .. 200) { print $s "$i\n"; my $l = <$s>; $ok++ if $l eq "echo $i\n"; }
    print "echo lines ok: $ok\n";
    print $s "bye\n";
    close $s;
}
kill 'TERM', $pid;
waitpid($pid, 0);
print "done\n";
