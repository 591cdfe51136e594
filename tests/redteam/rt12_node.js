// Round 12: Node cluster (the primary passes every connection to a worker over the IPC pair
// it made before the fork: round robin, or SCHED_NONE: the listener itself), node http
// keep-alive with many clients. usage: node rt12_node.js PORT rr|none CONNS KEEPALIVE_CLIENTS
const cluster = require('cluster');
const http = require('http');
const port = +process.argv[2];
const mode = process.argv[3] || 'rr';
const conns = +(process.argv[4] || 300);
const kac = +(process.argv[5] || 50);
if (process.argv[6] === 'client') {
  // short connections (Connection: close), 8 at a time; then kac keep-alive clients x 20 requests
  let ok = 0, bad = 0, next = 0, t0 = Date.now();
  const body = (i) => 'x'.repeat(i % 5000) + i;
  function one(agent, i, cb) {
    const req = http.request({ port, host: '127.0.0.1', path: '/' + i, agent, method: 'POST',
      headers: agent ? {} : { connection: 'close' } }, (res) => {
      let d = '';
      res.on('data', (c) => d += c);
      res.on('end', () => { if (d === 'echo:' + body(i)) ok++; else { bad++; if (bad < 5) console.log('bad', i, d.slice(0, 40)); } cb(); });
    });
    req.on('error', (e) => { bad++; if (bad < 5) console.log('err', i, e.code); cb(); });
    req.end(body(i));
  }
  function shorts(done) {
    let running = 0;
    function go() {
      while (running < 8 && next < conns) { running++; one(false, next++, () => { running--; if (next >= conns && running === 0) done(); else go(); }); }
    }
    go();
  }
  shorts(() => {
    const t1 = Date.now();
    console.log(`short: ${ok} ok ${bad} bad`);
    console.error(`short: ${conns} in ${t1 - t0} ms`);
    ok = 0; bad = 0;
    let left = kac;
    for (let c = 0; c < kac; c++) {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      let n = 0;
      const loop = () => { if (n++ < 20) one(agent, c * 100 + n, loop); else { agent.destroy(); if (--left === 0) { console.log(`keepalive: ${ok} ok ${bad} bad`); console.error(`keepalive: ${kac}x20 in ${Date.now() - t1} ms`); process.exit(0); } } };
      loop();
    }
  });
} else if (cluster.isPrimary) {
  cluster.schedulingPolicy = mode === 'none' ? cluster.SCHED_NONE : cluster.SCHED_RR;
  let up = 0;
  for (let i = 0; i < 2; i++) cluster.fork();
  cluster.on('listening', () => {
    if (++up < 2) return;
    const cp = require('child_process').fork(__filename, [port, mode, conns, kac, 'client']);
    cp.on('exit', (code) => { for (const id in cluster.workers) cluster.workers[id].kill(); process.exitCode = code; });
  });
} else {
  http.createServer((req, res) => {
    let d = '';
    req.on('data', (c) => d += c);
    req.on('end', () => res.end('echo:' + d));
  }).listen(port, '127.0.0.1');
}
