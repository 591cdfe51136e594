# Red-team round 27: Ruby's socket machinery around connections of the data path. Ruby
# closes an IO another thread is blocked on by waking that thread (its unblocking function
# sends it SIGVTALRM) and raising IOError in it before the descriptor closes; Timeout and
# Thread#raise/kill interrupt blocking reads the same way. Run with and without the library
# (world.sh tcp|smc ruby rt27_ruby.rb) and diff.
require 'socket'
require 'timeout'
$stdout.sync = true

server = TCPServer.new('127.0.0.1', 0)
port = server.addr[1]
def conn(port) = TCPSocket.new('127.0.0.1', port)
def drain(s)
  n = 0
  begin
    loop { n += s.readpartial(65536).bytesize }
  rescue EOFError
    "#{n} bytes then EOF"
  rescue => e
    "#{n} bytes then #{e.class}"
  end
end

# 1. IO#close while another thread is in a blocking read.
c = conn(port); a = server.accept
t = Thread.new { begin; c.read(10); "read"; rescue => e; e.class.to_s + ": " + e.message; end }
sleep 0.3
c.close
puts "close under read: #{t.value}"
puts "close under read, server: #{drain(a)}"
a.close

# 2. Timeout.timeout around a blocking read, then the connection used on.
c = conn(port); a = server.accept
r = begin
  Timeout.timeout(0.3) { c.read(4) }
rescue Timeout::Error => e
  "timeout"
end
puts "timeout read: #{r}"
a.write("late")
puts "then: #{c.read(4)}"
c.write("back"); puts "server: #{a.read(4)}"
c.close; puts "server end: #{drain(a)}"; a.close

# 3. Thread#raise into a thread blocked in gets; Thread#kill of one blocked in read.
c = conn(port); a = server.accept
t = Thread.new { begin; c.gets; rescue => e; e.class.to_s + ": " + e.message; end }
sleep 0.3
t.raise(RuntimeError, "stop")
puts "raise into gets: #{t.value}"
t = Thread.new { c.read(100) }
sleep 0.3
t.kill; t.join
puts "kill: #{t.status.inspect}"
a.write("after\n")
puts "gets after: #{c.gets.inspect}"
c.close; puts "server end: #{drain(a)}"; a.close

# 4. A write blocked on a full connection; the socket closed by another thread.
c = conn(port); a = server.accept
t = Thread.new { begin; 64.times { c.write("x" * (1 << 20)) }; "wrote all"; rescue => e; e.class.to_s; end }
sleep 0.5
c.close
puts "close under write: #{t.value}"
puts "close under write, server: #{drain(a).sub(/^\d+ bytes/, 'n bytes')}"
a.close

# 5. IO.select, read_nonblock / write_nonblock, wait_readable with a timeout.
c = conn(port); a = server.accept
puts "select early: #{IO.select([c], nil, nil, 0.2).inspect}"
puts "read_nonblock: #{c.read_nonblock(10, exception: false).inspect}"
puts "wait_readable: #{c.wait_readable(0.2).inspect}"
a.write("data")
puts "select later: #{IO.select([c], nil, nil, 5) ? 1 : 0}"
puts "read_nonblock: #{c.read_nonblock(10, exception: false).inspect}"
n = 0
loop { r = c.write_nonblock("y" * 65536, exception: false); break if r == :wait_writable; n += r }
puts "write_nonblock until full: #{n > 0}"
got = 0
rd = Thread.new { while got < n; got += a.readpartial(1 << 20).bytesize; end; got }
puts "server read all: #{rd.value == n}"
c.close; a.close

# 6. close_read under a blocked read (shutdown of the read side), shutdown, half-close.
c = conn(port); a = server.accept
t = Thread.new { begin; c.read(5).inspect; rescue => e; e.class.to_s; end }
sleep 0.3
c.shutdown(Socket::SHUT_RD)
puts "shutdown RD under read: #{t.value}"
c.write("half"); c.close_write
puts "server: #{a.read.inspect}"
a.write("reply"); a.close
c.close

# 7. 200 line echo through a server thread, then many short connections.
srv = Thread.new do
  10.times do
    s = server.accept
    while (l = s.gets); s.write("echo #{l}"); end
    s.close
  end
end
ok = 0
10.times do |k|
  s = conn(port)
  20.times { |i| s.write("#{k}-#{i}\n"); ok += 1 if s.gets == "echo #{k}-#{i}\n" }
  s.close
end
srv.join
puts "echo lines ok: #{ok}"
puts "done"
