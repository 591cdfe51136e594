// Red-team round 27: Node's ways with connections of the data path. A connected socket handed
// to a child process (`child.send('socket', sock)`: SCM_RIGHTS over Node's IPC channel, the
// parent's copy closed) with bytes in flight both ways; pause/resume with a large backlog;
// destroy under a large write; half-open (allowHalfOpen); setTimeout. Run with and without the
// library (world.sh tcp|smc node rt27_node.js) and diff.
'use strict';
const net = require('net');
const { fork } = require('child_process');
const crypto = require('crypto');

const sha = (b) => crypto.createHash('sha256').update(b).digest('hex').slice(0, 16);
const blob = (n, seed) => { const b = Buffer.alloc(n); let x = seed; for (let i = 0; i < n; i++) { x = (x * 1103515245 + 12345) >>> 0; b[i] = x >>> 24; } return b; };

if (process.argv[2] === 'child') {
  // The child: takes the socket, echoes what it reads with a prefix, reports the digest.
  process.on('message', (m, sock) => {
    if (m !== 'socket') return;
    const got = [];
    sock.on('data', (d) => { got.push(d); sock.write(d); });
    sock.on('end', () => {
      const all = Buffer.concat(got);
      process.send({ n: all.length, sha: sha(all), tail: sha(all.subarray(Math.max(0, all.length - (2 << 20)))) });
      sock.end();
    });
  });
  return;
}

function once(server) { return new Promise((r) => server.once('connection', r)); }
async function listen(opts) {
  const s = net.createServer(opts || {});
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  return s;
}
function connect(port, opts) {
  return new Promise((r) => { const c = net.connect(Object.assign({ port, host: '127.0.0.1' }, opts || {}), () => r(c)); });
}
function readAll(sock) {
  return new Promise((r) => { const got = []; sock.on('data', (d) => got.push(d)); sock.on('end', () => r(Buffer.concat(got))); sock.on('error', (e) => r('error ' + e.code)); });
}

async function handOff() {
  const srv = await listen();
  const acc = once(srv);
  const c = await connect(srv.address().port);
  const a = await acc;
  a.pause();
  const data = blob(3 << 20, 1);
  // Bytes written before the hand-off, some of them unread by the parent.
  c.write(data.subarray(0, 1 << 20));
  await new Promise((r) => setTimeout(r, 100));
  const child = fork(__filename, ['child']);
  const report = new Promise((r) => child.on('message', r));
  const echoed = readAll(c);
  child.send('socket', a);
  await new Promise((r) => setTimeout(r, 100));
  c.write(data.subarray(1 << 20));
  c.end();
  const rep = await report;
  const back = await echoed;
  // What the parent's Node read before the hand-off stays in its buffer (lost, as over TCP):
  // the child reads the rest, at least the 2 MiB written after the hand-off, and echoes it all.
  console.log(`handOff: child read the last 2 MiB ${rep.n >= (2 << 20) && rep.tail === sha(data.subarray(1 << 20))}, ` +
    `echoed what it read ${back.length === rep.n && sha(back) === rep.sha}`);
  child.disconnect();
  srv.close();
}

async function pauseResume() {
  const srv = await listen();
  const acc = once(srv);
  const c = await connect(srv.address().port);
  const a = await acc;
  a.pause();
  const data = blob(8 << 20, 2);
  let drains = 0;
  const wr = new Promise((r) => {
    let off = 0;
    const step = () => {
      while (off < data.length) {
        const ok = c.write(data.subarray(off, off + 65536));
        off += 65536;
        if (!ok) { drains++; c.once('drain', step); return; }
      }
      c.end(); r();
    };
    step();
  });
  await new Promise((r) => setTimeout(r, 300));
  const got = readAll(a);
  a.resume();
  await wr;
  const b = await got;
  console.log(`pauseResume: ${b.length} ${sha(b) === sha(data)} backpressure ${drains > 0}`);
  a.end();
  srv.close();
}

async function destroyUnderWrite() {
  const srv = await listen();
  const acc = once(srv);
  const c = await connect(srv.address().port);
  const a = await acc;
  a.pause();
  c.on('error', (e) => console.log('destroyUnderWrite client error', e.code));
  c.write(blob(16 << 20, 3));
  await new Promise((r) => setTimeout(r, 200));
  c.destroy();
  const got = readAll(a);
  a.resume();
  const b = await got;
  console.log(`destroyUnderWrite: server ${typeof b === 'string' ? b : 'read then end'}`);
  srv.close();
}

async function halfOpen() {
  const srv = await listen({ allowHalfOpen: true });
  const acc = once(srv);
  const c = await connect(srv.address().port, { allowHalfOpen: true });
  const a = await acc;
  const aGot = readAll(a);
  c.end('question');
  const q = await aGot;
  a.end('answer to ' + q.toString());
  const ans = await readAll(c);
  console.log(`halfOpen: ${ans.toString()}`);
  srv.close();
}

async function idleTimeout() {
  const srv = await listen();
  const acc = once(srv);
  const c = await connect(srv.address().port);
  const a = await acc;
  const t0 = Date.now();
  await new Promise((r) => { c.setTimeout(300, () => r()); });
  console.log(`idleTimeout: fired ${Date.now() - t0 >= 250}`);
  c.setTimeout(0);
  a.write('still here');
  const d = await new Promise((r) => c.once('data', r));
  console.log(`idleTimeout then: ${d.toString()}`);
  c.destroy(); a.destroy();
  srv.close();
}

async function resetByPeer() {
  const srv = await listen();
  const acc = once(srv);
  const c = await connect(srv.address().port);
  const a = await acc;
  const r = new Promise((res) => { c.on('error', (e) => res('error ' + e.code)); c.on('close', () => res('close')); });
  a.resetAndDestroy();
  console.log(`resetByPeer: ${await r}`);
  srv.close();
}

(async () => {
  const which = process.argv.slice(2);
  const all = { handOff, pauseResume, destroyUnderWrite, halfOpen, idleTimeout, resetByPeer };
  for (const [name, f] of Object.entries(all)) {
    if (which.length && !which.includes(name)) continue;
    try { await f(); } catch (e) { console.log(`${name} FAILED: ${e}`); }
  }
  process.exit(0);
})();
