# Round 13: Tcl sockets. usage: tclsh rt13_tcl.tcl PORT MODE N
#   echo   a fileevent echo server and N clients in the same interpreter (event loop, non-blocking
#          client sockets), 64 KB random each, checked.
#   exec   a server tclsh (started with `exec ... &`) answers each request line with the output
#          of `exec sha256sum` of it (a child per request: fork, exec, waitpid); this
#          interpreter's blocking clients check it against their own `exec sha256sum`.
lassign $argv port mode n
proc rnd {k len} { expr {srand($k+1)}; set s ""; for {set i 0} {$i < $len} {incr i} { append s [format %c [expr {int(rand()*256)}]] }; return $s }
proc accept {c a p} {
  fconfigure $c -translation binary -blocking 0 -buffering none
  fileevent $c readable [list serve $c]
}
proc serve {c} {
  global mode
  if {$mode eq "echo"} {
    set d [read $c]
    if {[eof $c]} { close $c; return }
    puts -nonewline $c $d
    return
  }
  if {[gets $c line] < 0} { if {[eof $c]} { close $c }; return }
  set h [lindex [exec sha256sum << $line] 0]
  puts $c $h; flush $c
}
set ok 0; set bad 0
if {$mode eq "server"} { socket -server accept -myaddr 127.0.0.1 $port; set mode exec; vwait forever }
if {$mode eq "echo"} {
  socket -server accept -myaddr 127.0.0.1 $port
  set left $n
  proc cread {s} {
    global want got ok bad left
    append got($s) [read $s]
    if {[string length $got($s)] >= [string length $want($s)] || [eof $s]} {
      if {$got($s) eq $want($s)} { incr ok } else { incr bad; puts "client $s: [string length $got($s)] bytes" }
      close $s; incr left -1
    }
  }
  for {set k 0} {$k < $n} {incr k} {
    set s [socket 127.0.0.1 $port]
    fconfigure $s -translation binary -blocking 0 -buffering none
    set want($s) [rnd $k 65536]; set got($s) ""
    puts -nonewline $s $want($s)
    fileevent $s readable [list cread $s]
  }
  while {$left > 0} { vwait left }
} else {
  set pid [exec [info nameofexecutable] [info script] $port server 0 &]
  after 300
  for {set k 0} {$k < $n} {incr k} {
    set s [socket 127.0.0.1 $port]
    fconfigure $s -translation lf
    set line "line $k [string repeat x [expr {$k * 37}]]"
    puts $s $line; flush $s
    set got [gets $s]
    set want [lindex [exec sha256sum << $line] 0]
    if {$got eq $want} { incr ok } else { incr bad; puts "client $k: got '$got' want '$want'" }
    close $s
  }
  exec kill $pid
}
puts "$mode: $ok of $n right, $bad wrong"
