// Round 13: Java 17 com.sun.net.httpserver + java.net.http.HttpClient (keep-alive, HTTP/1.1),
// a handler that runs a child (ProcessBuilder -> jspawnhelper, posix_spawn) per request and
// pipes the body through it, and a NIO Selector echo server, all with same-host connections.
// javac -d . rt13_http.java; java -cp . Rt13Http PORT MODE N
//   MODE http   N requests with random bodies (1..300 KB) over 4 client threads; the server
//               pipes each body through `sha256sum` (a child) and answers the digest; checked.
//   MODE nio    a Selector echo server, N clients (blocking SocketChannel), 200 KB each, checked.
//   MODE urlc   N HttpURLConnection requests (keep-alive pool) to the same server, no child.
import com.sun.net.httpserver.*;
import java.io.*;
import java.net.*;
import java.net.http.*;
import java.nio.*;
import java.nio.channels.*;
import java.security.*;
import java.util.*;
import java.util.concurrent.*;
import java.util.concurrent.atomic.*;

class Rt13Http {
  static String hex(byte[] b) {
    StringBuilder s = new StringBuilder();
    for (byte x : b) s.append(String.format("%02x", x));
    return s.toString();
  }
  static byte[] body(long seed) {
    Random r = new Random(seed);
    byte[] b = new byte[1 + r.nextInt(300_000)];
    r.nextBytes(b);
    return b;
  }
  public static void main(String[] a) throws Exception {
    int port = Integer.parseInt(a[0]);
    String mode = a[1];
    int n = Integer.parseInt(a[2]);
    long t0 = System.nanoTime();
    if (mode.equals("nio")) { nio(port, n); }
    else http(port, mode, n);
    System.out.printf("%s: %.1f s%n", mode, (System.nanoTime() - t0) / 1e9);
    System.exit(0);
  }
  static void http(int port, String mode, int n) throws Exception {
    HttpServer srv = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 64);
    srv.setExecutor(Executors.newFixedThreadPool(4));
    srv.createContext("/", ex -> {
      byte[] in = ex.getRequestBody().readAllBytes();
      String out;
      if (mode.equals("http")) {
        Process p = new ProcessBuilder("sha256sum").redirectErrorStream(true).start();
        Thread w = new Thread(() -> {
          try (OutputStream o = p.getOutputStream()) { o.write(in); } catch (IOException e) { }
        });
        w.start();
        String s = new String(p.getInputStream().readAllBytes()).split(" ")[0];
        try { p.waitFor(); w.join(); } catch (InterruptedException e) { }
        out = s + " rc=" + p.exitValue();
      } else {
        try { out = hex(MessageDigest.getInstance("SHA-256").digest(in)) + " rc=0"; }
        catch (Exception e) { out = "err"; }
      }
      byte[] ob = out.getBytes();
      ex.sendResponseHeaders(200, ob.length);
      try (OutputStream o = ex.getResponseBody()) { o.write(ob); }
    });
    srv.start();
    AtomicInteger ok = new AtomicInteger(), bad = new AtomicInteger();
    ExecutorService cl = Executors.newFixedThreadPool(4);
    HttpClient hc = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
    List<Future<?>> fs = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      final int k = i;
      fs.add(cl.submit(() -> {
        try {
          byte[] b = body(k);
          String want = hex(MessageDigest.getInstance("SHA-256").digest(b)) + " rc=0";
          String got;
          if (mode.equals("urlc")) {
            HttpURLConnection c = (HttpURLConnection) new URL("http://127.0.0.1:" + port + "/x").openConnection();
            c.setDoOutput(true);
            c.setRequestMethod("POST");
            try (OutputStream o = c.getOutputStream()) { o.write(b); }
            try (InputStream in = c.getInputStream()) { got = new String(in.readAllBytes()); }
          } else {
            HttpRequest rq = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/x"))
                .POST(HttpRequest.BodyPublishers.ofByteArray(b)).build();
            got = hc.send(rq, HttpResponse.BodyHandlers.ofString()).body();
          }
          if (got.equals(want)) ok.incrementAndGet();
          else { bad.incrementAndGet(); System.out.println("req " + k + ": got '" + got + "'"); }
        } catch (Exception e) { bad.incrementAndGet(); System.out.println("req " + k + ": " + e); }
      }));
    }
    for (Future<?> f : fs) f.get(60, TimeUnit.SECONDS);
    System.out.println(mode + ": " + ok.get() + " of " + n + " right, " + bad.get() + " wrong");
    cl.shutdown();
    srv.stop(0);
  }
  static void nio(int port, int n) throws Exception {
    Selector sel = Selector.open();
    ServerSocketChannel ss = ServerSocketChannel.open();
    ss.bind(new InetSocketAddress("127.0.0.1", port), 128);
    ss.configureBlocking(false);
    ss.register(sel, SelectionKey.OP_ACCEPT);
    Thread srv = new Thread(() -> {
      try {
        Map<SocketChannel, ArrayDeque<ByteBuffer>> pend = new HashMap<>();
        while (true) {
          sel.select();
          for (Iterator<SelectionKey> it = sel.selectedKeys().iterator(); it.hasNext(); ) {
            SelectionKey k = it.next();
            it.remove();
            if (!k.isValid()) continue;
            if (k.isAcceptable()) {
              SocketChannel c = ss.accept();
              if (c == null) continue;
              c.configureBlocking(false);
              c.register(sel, SelectionKey.OP_READ);
              pend.put(c, new ArrayDeque<>());
              continue;
            }
            SocketChannel c = (SocketChannel) k.channel();
            ArrayDeque<ByteBuffer> q = pend.get(c);
            if (k.isReadable()) {
              ByteBuffer b = ByteBuffer.allocate(8192);
              int r = c.read(b);
              if (r < 0) { c.close(); pend.remove(c); continue; }
              b.flip();
              if (b.hasRemaining()) q.add(b);
            }
            if (k.isValid() && (k.isWritable() || !q.isEmpty())) {
              while (!q.isEmpty()) {
                ByteBuffer b = q.peek();
                c.write(b);
                if (b.hasRemaining()) break;
                q.poll();
              }
              k.interestOps(q.isEmpty() ? SelectionKey.OP_READ : SelectionKey.OP_READ | SelectionKey.OP_WRITE);
            }
          }
        }
      } catch (Exception e) { System.out.println("server: " + e); }
    });
    srv.setDaemon(true);
    srv.start();
    AtomicInteger ok = new AtomicInteger(), bad = new AtomicInteger();
    ExecutorService cl = Executors.newFixedThreadPool(8);
    List<Future<?>> fs = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      final int k = i;
      fs.add(cl.submit(() -> {
        try (SocketChannel c = SocketChannel.open(new InetSocketAddress("127.0.0.1", port))) {
          byte[] b = new byte[200_000];
          new Random(k).nextBytes(b);
          Thread w = new Thread(() -> {
            try { ByteBuffer bb = ByteBuffer.wrap(b); while (bb.hasRemaining()) c.write(bb); c.shutdownOutput(); }
            catch (IOException e) { System.out.println("w " + k + ": " + e); }
          });
          w.start();
          ByteBuffer in = ByteBuffer.allocate(b.length + 1);
          while (c.read(in) > 0) { }
          w.join();
          in.flip();
          byte[] g = new byte[in.remaining()];
          in.get(g);
          if (Arrays.equals(g, b)) ok.incrementAndGet();
          else { bad.incrementAndGet(); System.out.println("client " + k + ": " + g.length + " bytes"); }
        } catch (Exception e) { bad.incrementAndGet(); System.out.println("client " + k + ": " + e); }
      }));
    }
    for (Future<?> f : fs) f.get(60, TimeUnit.SECONDS);
    System.out.println("nio: " + ok.get() + " of " + n + " right, " + bad.get() + " wrong");
  }
}
