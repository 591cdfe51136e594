// Red-team round 27: the JDK's own socket machinery around connections of the data path.
// Java closes a socket another thread is blocked on by dup2'ing a half-closed socketpair onto
// its descriptor and signalling the thread (NioSocketImpl / NativeThread), times reads out
// with poll, interrupts channels, and runs selectors and asynchronous channels on epoll.
// Every scenario prints what the program observes; run it with and without the library and
// diff. `javac -d DIR rt27_java.java; java -cp DIR Rt27Java [SCENARIO...]` (none: all).
import java.io.*;
import java.net.*;
import java.nio.ByteBuffer;
import java.nio.channels.*;
import java.util.*;
import java.util.concurrent.*;

class Rt27Java {
    static final PrintStream out = System.out;

    interface Scenario { void run(ServerSocket ss) throws Exception; }

    static void say(String s) { synchronized (out) { out.println(s); out.flush(); } }

    static String name(Throwable t) {
        if (t == null) return "none";
        String m = t.getMessage();
        return t.getClass().getSimpleName() + (m == null ? "" : ": " + m);
    }

    /** The server end's observations: reads to EOF or error, returns "n bytes, <how it ended>". */
    static String drain(Socket s) {
        long n = 0;
        try (InputStream in = s.getInputStream()) {
            byte[] b = new byte[65536];
            for (;;) {
                int r = in.read(b);
                if (r < 0) return n + " bytes then EOF";
                n += r;
            }
        } catch (IOException e) {
            return n + " bytes then " + name(e);
        }
    }

    static String drainKind(Socket s) {
        String r = drain(s);
        return r.substring(r.indexOf(" then ") + 6);
    }

    static Socket connect(ServerSocket ss) throws IOException {
        return new Socket(InetAddress.getLoopbackAddress(), ss.getLocalPort());
    }

    static void sleep(long ms) { try { Thread.sleep(ms); } catch (InterruptedException e) { } }

    /** A thread blocked in Socket read; another closes the socket. */
    static void closeRead(ServerSocket ss) throws Exception {
        Socket c = connect(ss);
        Socket a = ss.accept();
        a.getOutputStream().write("hello".getBytes());
        CompletableFuture<String> reader = CompletableFuture.supplyAsync(() -> {
            try {
                InputStream in = c.getInputStream();
                byte[] b = new byte[100];
                int r = in.read(b);
                String first = new String(b, 0, r);
                try { r = in.read(b); return "read " + first + " then " + r; }
                catch (IOException e) { return "read " + first + " then " + name(e); }
            } catch (IOException e) { return name(e); }
        });
        sleep(300);
        c.close();
        say("closeRead reader: " + reader.get(10, TimeUnit.SECONDS));
        say("closeRead server: " + drain(a));
        a.close();
    }

    /** A thread blocked in Socket write (the peer does not read); another closes it. */
    static void closeWrite(ServerSocket ss) throws Exception {
        Socket c = connect(ss);
        Socket a = ss.accept();
        CompletableFuture<String> writer = CompletableFuture.supplyAsync(() -> {
            try {
                OutputStream o = c.getOutputStream();
                byte[] b = new byte[1 << 20];
                for (int i = 0; i < 256; i++) o.write(b);
                return "wrote all";
            } catch (IOException e) { return name(e); }
        });
        sleep(500);
        c.close();
        say("closeWrite writer: " + writer.get(10, TimeUnit.SECONDS));
        say("closeWrite server: " + drainKind(a));
        a.close();
    }

    /** A blocking SocketChannel read; another thread closes the channel. */
    static void nioCloseRead(ServerSocket ss) throws Exception {
        SocketChannel c = SocketChannel.open(ss.getLocalSocketAddress());
        Socket a = ss.accept();
        CompletableFuture<String> reader = CompletableFuture.supplyAsync(() -> {
            try { return "read " + c.read(ByteBuffer.allocate(100)); }
            catch (IOException e) { return name(e); }
        });
        sleep(300);
        c.close();
        say("nioCloseRead reader: " + reader.get(10, TimeUnit.SECONDS));
        say("nioCloseRead server: " + drain(a));
        a.close();
    }

    /** A blocking SocketChannel read interrupted: the channel closes (ClosedByInterrupt). */
    static void nioInterrupt(ServerSocket ss) throws Exception {
        SocketChannel c = SocketChannel.open(ss.getLocalSocketAddress());
        Socket a = ss.accept();
        final String[] res = new String[1];
        Thread t = new Thread(() -> {
            try { res[0] = "read " + c.read(ByteBuffer.allocate(100)); }
            catch (IOException e) { res[0] = name(e); }
        });
        t.start();
        sleep(300);
        t.interrupt();
        t.join(10000);
        say("nioInterrupt reader: " + res[0] + ", open " + c.isOpen());
        say("nioInterrupt server: " + drain(a));
        a.close();
    }

    /** SO_TIMEOUT: a timed read times out, the connection stays usable. */
    static void soTimeout(ServerSocket ss) throws Exception {
        Socket c = connect(ss);
        Socket a = ss.accept();
        c.setSoTimeout(200);
        InputStream in = c.getInputStream();
        byte[] b = new byte[100];
        try { say("soTimeout first: read " + in.read(b)); }
        catch (IOException e) { say("soTimeout first: " + name(e)); }
        a.getOutputStream().write("late".getBytes());
        int r = in.read(b);
        say("soTimeout second: " + new String(b, 0, r));
        c.getOutputStream().write("back".getBytes());
        byte[] ab = new byte[10];
        int n = a.getInputStream().read(ab);
        say("soTimeout server: " + new String(ab, 0, n));
        c.close();
        say("soTimeout server end: " + drain(a));
        a.close();
    }

    /** A thread blocked in read; another shuts the input down. */
    static void shutdownInputBlocked(ServerSocket ss) throws Exception {
        Socket c = connect(ss);
        Socket a = ss.accept();
        CompletableFuture<String> reader = CompletableFuture.supplyAsync(() -> {
            try { return "read " + c.getInputStream().read(new byte[100]); }
            catch (IOException e) { return name(e); }
        });
        sleep(300);
        c.shutdownInput();
        say("shutdownInputBlocked reader: " + reader.get(10, TimeUnit.SECONDS));
        c.getOutputStream().write("still".getBytes());
        c.shutdownOutput();
        say("shutdownInputBlocked server: " + drain(a));
        c.close();
        a.close();
    }

    /** Urgent data inline. */
    static void urgent(ServerSocket ss) throws Exception {
        Socket c = connect(ss);
        Socket a = ss.accept();
        a.setOOBInline(true);
        OutputStream o = c.getOutputStream();
        o.write("ab".getBytes());
        c.sendUrgentData('U');
        o.write("cd".getBytes());
        c.shutdownOutput();
        InputStream in = a.getInputStream();
        ByteArrayOutputStream got = new ByteArrayOutputStream();
        byte[] b = new byte[100];
        int r;
        while ((r = in.read(b)) > 0) got.write(b, 0, r);
        say("urgent server: " + got);
        c.close();
        a.close();
    }

    /** A Selector blocked in select with the channel registered; another thread closes it. */
    static void selectorClose(ServerSocket ss) throws Exception {
        SocketChannel c = SocketChannel.open(ss.getLocalSocketAddress());
        Socket a = ss.accept();
        c.configureBlocking(false);
        Selector sel = Selector.open();
        c.register(sel, SelectionKey.OP_READ);
        CompletableFuture<String> sf = CompletableFuture.supplyAsync(() -> {
            try {
                int n = sel.select(3000);
                return "selected " + n + ", keys " + sel.keys().size();
            } catch (IOException e) { return name(e); }
        });
        sleep(300);
        c.close();
        sel.wakeup();
        say("selectorClose select: " + sf.get(10, TimeUnit.SECONDS));
        say("selectorClose after: " + sel.selectNow() + " keys " + sel.keys().size());
        say("selectorClose server: " + drain(a));
        sel.close();
        a.close();
    }

    /** A Selector echo of 4 MB in 3 000-byte writes over non-blocking channels. */
    static void selectorEcho(ServerSocket ss) throws Exception {
        SocketChannel c = SocketChannel.open(ss.getLocalSocketAddress());
        Socket a = ss.accept();
        Thread echo = new Thread(() -> {
            try {
                InputStream in = a.getInputStream();
                OutputStream o = a.getOutputStream();
                byte[] b = new byte[7777];
                int r;
                while ((r = in.read(b)) > 0) o.write(b, 0, r);
                a.shutdownOutput();
            } catch (IOException e) { say("selectorEcho echo: " + name(e)); }
        });
        echo.start();
        c.configureBlocking(false);
        Selector sel = Selector.open();
        SelectionKey k = c.register(sel, SelectionKey.OP_READ | SelectionKey.OP_WRITE);
        int total = 4 << 20;
        byte[] data = new byte[total];
        new Random(27).nextBytes(data);
        ByteBuffer src = ByteBuffer.wrap(data);
        ByteArrayOutputStream got = new ByteArrayOutputStream();
        ByteBuffer rb = ByteBuffer.allocate(5000);
        boolean eof = false;
        while (!eof) {
            sel.select(5000);
            for (SelectionKey sk : sel.selectedKeys()) {
                if (sk.isWritable() && src.hasRemaining()) {
                    ByteBuffer chunk = src.slice();
                    chunk.limit(Math.min(3000, chunk.remaining()));
                    int w = c.write(chunk);
                    src.position(src.position() + w);
                    if (!src.hasRemaining()) {
                        c.shutdownOutput();
                        k.interestOps(SelectionKey.OP_READ);
                    }
                }
                if (sk.isReadable()) {
                    rb.clear();
                    int r = c.read(rb);
                    if (r < 0) eof = true;
                    else got.write(rb.array(), 0, r);
                }
            }
            sel.selectedKeys().clear();
        }
        echo.join();
        say("selectorEcho: " + got.size() + " bytes, same " + Arrays.equals(got.toByteArray(), data));
        sel.close();
        c.close();
        a.close();
    }

    /** AsynchronousSocketChannel (an epoll thread pool): 2 MB up, echoed. */
    static void asyncEcho(ServerSocket ss0) throws Exception {
        AsynchronousServerSocketChannel ls = AsynchronousServerSocketChannel.open()
            .bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0));
        Future<AsynchronousSocketChannel> af = ls.accept();
        AsynchronousSocketChannel c = AsynchronousSocketChannel.open();
        c.connect(ls.getLocalAddress()).get(10, TimeUnit.SECONDS);
        AsynchronousSocketChannel a = af.get(10, TimeUnit.SECONDS);
        byte[] data = new byte[2 << 20];
        new Random(7).nextBytes(data);
        CompletableFuture<Void> echo = CompletableFuture.runAsync(() -> {
            try {
                ByteBuffer b = ByteBuffer.allocate(10000);
                for (;;) {
                    b.clear();
                    int r = a.read(b).get(10, TimeUnit.SECONDS);
                    if (r < 0) break;
                    b.flip();
                    while (b.hasRemaining()) a.write(b).get(10, TimeUnit.SECONDS);
                }
                a.shutdownOutput();
            } catch (Exception e) { say("asyncEcho echo: " + name(e)); }
        });
        CompletableFuture<Void> up = CompletableFuture.runAsync(() -> {
            try {
                ByteBuffer s = ByteBuffer.wrap(data);
                while (s.hasRemaining()) c.write(s).get(10, TimeUnit.SECONDS);
                c.shutdownOutput();
            } catch (Exception e) { say("asyncEcho up: " + name(e)); }
        });
        ByteArrayOutputStream got = new ByteArrayOutputStream();
        ByteBuffer b = ByteBuffer.allocate(65536);
        for (;;) {
            b.clear();
            int r = c.read(b).get(10, TimeUnit.SECONDS);
            if (r < 0) break;
            got.write(b.array(), 0, r);
        }
        up.get(10, TimeUnit.SECONDS);
        echo.get(10, TimeUnit.SECONDS);
        say("asyncEcho: " + got.size() + " bytes, same " + Arrays.equals(got.toByteArray(), data));
        // A read pending when the channel closes.
        Future<Integer> pending = a.read(ByteBuffer.allocate(10));
        sleep(100);
        a.close();
        try { say("asyncEcho pending: " + pending.get(10, TimeUnit.SECONDS)); }
        catch (ExecutionException e) { say("asyncEcho pending: " + name(e.getCause())); }
        c.close();
        ls.close();
    }

    /** Linger 0: the peer sees a reset, as over TCP. */
    static void lingerZero(ServerSocket ss) throws Exception {
        Socket c = connect(ss);
        Socket a = ss.accept();
        c.getOutputStream().write("x".getBytes());
        byte[] b = new byte[1];
        a.getInputStream().read(b);
        c.setSoLinger(true, 0);
        c.close();
        sleep(200);
        say("lingerZero server: " + drain(a));
        a.close();
    }

    /** A connection passed from thread to thread by close-on-one, read-on-other patterns:
     *  available(), skip() and mark of the stream. */
    static void available(ServerSocket ss) throws Exception {
        Socket c = connect(ss);
        Socket a = ss.accept();
        a.getOutputStream().write(new byte[1000]);
        sleep(200);
        InputStream in = c.getInputStream();
        say("available: " + in.available());
        say("available skip: " + in.skip(600) + " then " + in.available());
        a.close();
        sleep(100);
        say("available after close: " + drain(c));
        c.close();
    }

    /** A thread blocked in ServerSocket.accept; another closes the listener. */
    static void acceptClose(ServerSocket unused) throws Exception {
        ServerSocket ls = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        CompletableFuture<String> acc = CompletableFuture.supplyAsync(() -> {
            try { ls.accept(); return "accepted"; }
            catch (IOException e) { return name(e); }
        });
        sleep(300);
        ls.close();
        say("acceptClose accept: " + acc.get(10, TimeUnit.SECONDS));
        try (Socket c = new Socket(InetAddress.getLoopbackAddress(), ls.getLocalPort())) {
            say("acceptClose connect after: connected");
        } catch (IOException e) { say("acceptClose connect after: " + e.getClass().getSimpleName()); }
    }

    /** A blocking ServerSocketChannel.accept; another thread closes the channel. */
    static void nioAcceptClose(ServerSocket unused) throws Exception {
        ServerSocketChannel ls = ServerSocketChannel.open()
            .bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0));
        CompletableFuture<String> acc = CompletableFuture.supplyAsync(() -> {
            try { ls.accept(); return "accepted"; }
            catch (IOException e) { return name(e); }
        });
        sleep(300);
        ls.close();
        say("nioAcceptClose accept: " + acc.get(10, TimeUnit.SECONDS));
    }

    /** A connection accepted while another thread waits to close the listener, then used. */
    static void acceptThenClose(ServerSocket unused) throws Exception {
        ServerSocket ls = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        CompletableFuture<Socket> acc = CompletableFuture.supplyAsync(() -> {
            try { return ls.accept(); } catch (IOException e) { return null; }
        });
        Socket c = new Socket(InetAddress.getLoopbackAddress(), ls.getLocalPort());
        Socket a = acc.get(10, TimeUnit.SECONDS);
        ls.close();
        c.getOutputStream().write("ping".getBytes());
        byte[] b = new byte[4];
        int n = a.getInputStream().read(b);
        a.getOutputStream().write("pong".getBytes());
        int m = c.getInputStream().read(b);
        say("acceptThenClose: " + n + " " + m + " " + new String(b, 0, m));
        c.close();
        say("acceptThenClose server: " + drain(a));
        a.close();
    }

    /** A read blocked with SO_TIMEOUT set (a poll with a timeout); another thread closes. */
    static void timedReadClose(ServerSocket ss) throws Exception {
        Socket c = connect(ss);
        Socket a = ss.accept();
        c.setSoTimeout(5000);
        CompletableFuture<String> reader = CompletableFuture.supplyAsync(() -> {
            try { return "read " + c.getInputStream().read(new byte[100]); }
            catch (IOException e) { return name(e); }
        });
        sleep(300);
        c.close();
        say("timedReadClose reader: " + reader.get(10, TimeUnit.SECONDS));
        say("timedReadClose server: " + drain(a));
        a.close();
    }

    /** A write blocked on a full connection through a SocketChannel; the channel is closed. */
    static void nioCloseWrite(ServerSocket ss) throws Exception {
        SocketChannel c = SocketChannel.open(ss.getLocalSocketAddress());
        Socket a = ss.accept();
        CompletableFuture<String> writer = CompletableFuture.supplyAsync(() -> {
            try {
                ByteBuffer b = ByteBuffer.allocate(1 << 20);
                for (int i = 0; i < 256; i++) { b.clear(); while (b.hasRemaining()) c.write(b); }
                return "wrote all";
            } catch (IOException e) { return e.getClass().getSimpleName(); }
        });
        sleep(500);
        c.close();
        say("nioCloseWrite writer: " + writer.get(10, TimeUnit.SECONDS));
        say("nioCloseWrite server: " + drainKind(a));
        a.close();
    }

    public static void main(String[] args) throws Exception {
        Map<String, Scenario> all = new LinkedHashMap<>();
        all.put("closeRead", Rt27Java::closeRead);
        all.put("closeWrite", Rt27Java::closeWrite);
        all.put("nioCloseRead", Rt27Java::nioCloseRead);
        all.put("nioInterrupt", Rt27Java::nioInterrupt);
        all.put("soTimeout", Rt27Java::soTimeout);
        all.put("shutdownInputBlocked", Rt27Java::shutdownInputBlocked);
        all.put("urgent", Rt27Java::urgent);
        all.put("selectorClose", Rt27Java::selectorClose);
        all.put("selectorEcho", Rt27Java::selectorEcho);
        all.put("asyncEcho", Rt27Java::asyncEcho);
        all.put("lingerZero", Rt27Java::lingerZero);
        all.put("available", Rt27Java::available);
        all.put("acceptClose", Rt27Java::acceptClose);
        all.put("nioAcceptClose", Rt27Java::nioAcceptClose);
        all.put("acceptThenClose", Rt27Java::acceptThenClose);
        all.put("timedReadClose", Rt27Java::timedReadClose);
        all.put("nioCloseWrite", Rt27Java::nioCloseWrite);
        List<String> which = args.length == 0 ? new ArrayList<>(all.keySet()) : Arrays.asList(args);
        try (ServerSocket ss = new ServerSocket(0, 50, InetAddress.getLoopbackAddress())) {
            for (String w : which) {
                Scenario s = all.get(w);
                if (s == null) { say("unknown scenario " + w); continue; }
                try { s.run(ss); }
                catch (Throwable t) { say(w + " FAILED: " + name(t)); }
            }
        }
        System.exit(0);
    }
}
