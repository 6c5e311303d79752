// The monoseq web console: plain JavaScript, no library, no build step. Every value reaches
// the page as a text node (never as HTML), so an event holding `<script>` shows as text.
// Views poll the API at most once a second; the partition view follows the SSE tail.
'use strict';

const POLL_MS = 1000;          // one refresh a second at most
const TIMEOUT_MS = 3000;       // a request unanswered this long counts as a node down
const LIVE_WINDOW = 200;       // events the live partition view keeps (older ones are dropped)
const PAGE = 50;               // events per page
const LAG_SAMPLES = 300;       // lag samples kept per consumer partition (5 minutes)
const TOKEN_KEY = 'monoseq.token';

const S = {
  token: sessionStorage.getItem(TOKEN_KEY) || '',
  scope: null,        // read, write or admin once the token is known
  tokens: false,      // whether the server requires tokens
  view: 0,            // generation: a view's loops stop when another view starts
  down: null,         // why the node does not answer, while it does not
  lastOk: null,
  lag: new Map(),     // "consumer/partition" -> [lag samples]
  ends: new Map(),    // partition -> [end, time] for commands/s
  counts: null,       // previous metrics sample for the health view
  armed: new Set(),   // consumers whose delete button was clicked once; kept across re-renders
  live: null,         // the live tail being followed
};

// ---------------------------------------------------------------- DOM helpers

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === undefined || kid === null || kid === false) continue;
    e.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return e;
}

function table(head, rows, rowClass) {
  return h('table', {},
    h('thead', {}, h('tr', {}, head.map((c) => h('th', {}, c)))),
    h('tbody', {}, rows.map((r, i) => h('tr', { class: rowClass ? rowClass(i) : null },
      r.map((c) => (c instanceof Node && c.tagName === 'TD') ? c : h('td', {}, c))))));
}

const num = (v) => h('td', { class: 'num' }, v === undefined || v === null ? '—' : String(v));
const main = () => document.getElementById('main');
function show(...nodes) { main().replaceChildren(...nodes.flat()); }
function json(v) { return h('pre', {}, JSON.stringify(v, null, 1)); }
function ago(ms) {
  if (ms === undefined || ms === null) return '—';
  return ms < 1000 ? `${ms} ms` : `${(ms / 1000).toFixed(1)} s`;
}

function spark(values) {
  const w = 160, hgt = 28, max = Math.max(1, ...values);
  const pts = values.map((v, i) =>
    `${(i / Math.max(1, values.length - 1)) * w},${hgt - (v / max) * (hgt - 2) - 1}`).join(' ');
  const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('width', w); svg.setAttribute('height', hgt);
  const line = document.createElementNS('http://www.w3.org/2000/svg', 'polyline');
  line.setAttribute('points', pts); line.setAttribute('fill', 'none');
  line.setAttribute('stroke', '#2962ff'); line.setAttribute('stroke-width', '1.5');
  svg.append(line);
  return svg;
}

// ---------------------------------------------------------------- the API

class Down extends Error {}
class Refused extends Error {
  constructor(status, body) {
    super((body && body.message) || `HTTP ${status}`);
    this.status = status; this.body = body;
  }
}

function headers(extra) {
  const hs = Object.assign({}, extra || {});
  if (S.token) hs.Authorization = `Bearer ${S.token}`;
  return hs;
}

// fetch with a timeout; a node that does not answer raises Down (the banner says so).
async function call(path, opts) {
  const ctl = new AbortController();
  const t = setTimeout(() => ctl.abort(), TIMEOUT_MS);
  let r;
  try {
    r = await fetch(path, Object.assign({ headers: headers(), signal: ctl.signal, cache: 'no-store' }, opts || {}));
  } catch (e) {
    nodeDown(`this node (${location.host}) does not answer: ${e.name === 'AbortError' ? 'no answer in 3 s' : e.message}`);
    throw new Down(String(e));
  } finally {
    clearTimeout(t);
  }
  nodeUp();
  if (r.status === 401) { S.scope = null; login('The server needs a token, or refused this one.'); throw new Refused(401); }
  return r;
}

async function get(path) {
  const r = await call(path);
  const text = await r.text();
  let body = null;
  try { body = JSON.parse(text); } catch (_) { body = text; }
  if (!r.ok) throw new Refused(r.status, body);
  return body;
}

// The answer, or null when the endpoint does not exist on this server (404 not_found).
async function getOptional(path) {
  try { return await get(path); } catch (e) {
    if (e instanceof Refused && e.status === 404 && e.body && e.body.code === 'not_found') return null;
    throw e;
  }
}

function nodeDown(why) {
  S.down = why;
  const b = document.getElementById('banner');
  const since = S.lastOk ? ` Last answer at ${S.lastOk.toLocaleTimeString()}; what is shown is from then.` : '';
  b.textContent = `Node unreachable: ${why}. Retrying every second.${since} Other nodes serve the same console at /ui.`;
  b.hidden = false;
}

function nodeUp() {
  S.lastOk = new Date();
  if (S.down === null) return;
  S.down = null;
  const b = document.getElementById('banner');
  b.hidden = true; b.textContent = '';
}

// Runs `step` now and then every POLL_MS while the view that started it is current.
function every(step) {
  const gen = S.view;
  const run = async () => {
    if (gen !== S.view) return;
    try { await step(); } catch (e) { if (!(e instanceof Down) && !(e instanceof Refused && e.status === 401)) console.warn(e); }
    if (gen === S.view) setTimeout(run, POLL_MS);
  };
  run();
}

function errorBox(e) {
  if (e instanceof Refused) return h('p', { class: 'bad' }, `${e.status}: ${e.message}`);
  return h('p', { class: 'bad' }, String(e.message || e));
}

// ---------------------------------------------------------------- login and navigation

const VIEWS = [
  ['cluster', 'Cluster'], ['partition/0', 'Partitions'], ['workspace', 'Workspaces'],
  ['consumers', 'Consumers'], ['sequences', 'Sequences'], ['health', 'Health'],
];

function nav(current) {
  const n = document.getElementById('nav');
  n.replaceChildren(...VIEWS.map(([path, label]) =>
    h('a', { href: `#/${path}`, class: current === path.split('/')[0] ? 'on' : null }, label)));
  const who = document.getElementById('who');
  who.replaceChildren(
    S.scope ? h('span', { id: 'scope' }, S.tokens ? `token: ${S.scope}` : `no tokens (${S.scope})`) : '',
    S.tokens && S.scope ? h('button', { onclick: () => { sessionStorage.removeItem(TOKEN_KEY); S.token = ''; S.scope = null; route(); } }, 'Log out') : '');
}

function login(message) {
  S.view++;
  stopLive();
  document.getElementById('nav').replaceChildren();
  document.getElementById('who').replaceChildren();
  const input = h('input', { type: 'password', id: 'token', autocomplete: 'current-password', placeholder: 'token' });
  show(h('form', { class: 'login', id: 'login', onsubmit: (ev) => {
    ev.preventDefault();
    S.token = input.value.trim();
    sessionStorage.setItem(TOKEN_KEY, S.token);
    S.scope = null;
    route();
  } },
  h('h2', {}, 'Log in to monoseq'),
  h('p', {}, message || 'This server requires a token.'),
  h('label', { for: 'token' }, 'Token (read, write or admin)'), input,
  h('button', { type: 'submit' }, 'Log in'),
  h('p', { class: 'muted' }, 'The token stays in this tab (session storage) and goes only to this server.')));
}

async function knowScope() {
  if (S.scope) return true;
  const r = await call('/v1/token');
  if (r.status === 404) { S.scope = 'read'; S.tokens = true; return true; }
  if (!r.ok) { login(`The server refused the token (${r.status}).`); return false; }
  const body = await r.json();
  S.scope = body.scope; S.tokens = body.tokens;
  return true;
}

async function route() {
  S.view++;
  S.armed.clear();
  stopLive();
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  try {
    if (!(await knowScope())) return;
  } catch (e) {
    if (e instanceof Down) {
      show(h('h2', {}, 'Waiting for the node'), h('p', {}, 'The console retries every second.'));
      const gen = S.view;
      setTimeout(() => { if (gen === S.view) route(); }, POLL_MS);
    }
    return;
  }
  const name = parts[0] || 'cluster';
  nav(name);
  const views = { cluster, partition, workspace, consumers, sequences, health };
  (views[name] || cluster)(parts.slice(1));
}

// ---------------------------------------------------------------- cluster

async function partitionEnd(p) {
  const page = await get(`/v1/partitions/${p}/events?from=4611686018427387904&limit=1`);
  return page.end;
}

function rate(p, end) {
  const now = performance.now();
  const prev = S.ends.get(p);
  S.ends.set(p, [end, now]);
  if (!prev || now - prev[1] < 200) return null;
  return Math.max(0, (end - prev[0]) / ((now - prev[1]) / 1000));
}

async function readiness() {
  const r = await call('/readyz');
  const text = await r.text();
  if (r.ok) return { ready: true, reasons: new Map() };
  let body = {};
  try { body = JSON.parse(text); } catch (_) { /* plain text */ }
  const reasons = new Map((body.partitions || []).map((p) => [p.partition, p.reason]));
  return { ready: false, message: body.message || text, reasons };
}

function cluster() {
  show(h('h2', {}, 'Cluster'), h('div', { id: 'cluster' }, 'Loading…'));
  every(async () => {
    const [c, ready] = await Promise.all([get('/v1/cluster'), readiness()]);
    const ps = c.clustered ? c.partitions.map((p) => p.partition) : c.partitions;
    const ends = await Promise.all(ps.map((p) => partitionEnd(p).catch(() => null)));
    const out = [];
    out.push(h('p', { id: 'readiness', class: ready.ready ? 'state-serving' : 'state-refused' },
      ready.ready ? 'This node is ready: it answers or forwards a command for every partition.'
        : `This node is not ready: ${ready.message}`));
    if (c.clustered) {
      out.push(h('h3', {}, 'Nodes'));
      out.push(table(['node', 'address', 'alive', 'last renewal', 'partitions'],
        c.nodes.map((n) => [
          n.node_id + (n.node_id === c.node_id ? ' (this node)' : ''),
          h('a', { href: `${n.url}/ui/` }, n.url),
          n.alive ? 'yes' : h('span', { class: 'bad' }, 'no'),
          ago(n.seen_ms_ago), n.partitions.join(', ')])));
      out.push(h('p', { class: 'muted' }, `lease ${c.lease_ms} ms, renewed every ${c.renew_ms} ms`));
    } else {
      out.push(h('p', { class: 'muted' }, c.message));
    }
    out.push(h('h3', {}, 'Partitions'));
    const rows = ps.map((p, i) => {
      const lease = c.clustered ? c.partitions[i] : null;
      const owner = lease ? lease.owner : 'this node';
      const reason = ready.reasons.get(p);
      let state = 'serving';
      if (!owner) state = 'moving';
      if (reason) state = `refused: ${reason}`;
      const r = ends[i] === null ? null : rate(p, ends[i]);
      return [h('a', { href: `#/partition/${p}` }, String(p)), h('td', { 'data-owner-of': p }, owner || '—'), num(ends[i]),
        num(r === null ? null : r.toFixed(1)),
        h('td', { class: `state-${state.split(':')[0]}`, 'data-partition': p }, state),
        num(lease ? lease.epoch : null), lease ? ago(lease.lease_age_ms) : '—'];
    });
    out.push(table(['partition', 'owner', 'end', 'commands/s', 'state', 'epoch', 'lease age'], rows));
    document.getElementById('cluster').replaceChildren(...out);
  });
}

// ---------------------------------------------------------------- a partition

function eventRow(e) {
  if (e.gap) {
    return [num(`${e.gap.from}–${e.gap.to}`),
      h('td', { colspan: 5 }, `gap: offsets ${e.gap.from} to ${e.gap.to} hold no events (${e.gap.reason})`)];
  }
  return [num(e.plog_offset), h('a', { href: `#/workspace/${e.ws}` }, String(e.ws)), num(e.wlog_offset),
    e.command, new Date(e.registered_at_ms).toISOString(),
    json({ argument: e.argument, created: e.created, updated: e.updated, key: e.idempotency_key })];
}

const EVENT_HEAD = ['offset', 'workspace', 'WLog', 'command', 'registered', 'body'];
const gapClass = (rows) => (i) => (rows[i] && rows[i].gap ? 'gap' : null);

function partition(args) {
  const p = Number(args[0] || 0);
  const from = args[1] === undefined ? null : Number(args[1]);
  const box = h('div', { id: 'events' }, 'Loading…');
  const pick = h('input', { type: 'number', min: 0, value: p, id: 'pick-partition', class: 'narrow' });
  const at = h('input', { type: 'number', min: 1, value: from || '', id: 'from', placeholder: 'offset', class: 'wide' });
  show(h('h2', {}, `Partition ${p}`),
    h('form', { class: 'inline', onsubmit: (ev) => { ev.preventDefault(); location.hash = `#/partition/${pick.value}${at.value ? `/${at.value}` : ''}`; } },
      'partition', pick, 'from offset', at, h('button', { type: 'submit' }, 'Show'),
      h('button', { type: 'button', id: 'follow', onclick: () => { location.hash = `#/partition/${p}/live`; } }, 'Follow live')),
    box);
  if (args[1] === 'live') return follow(p, box);
  (async () => {
    try {
      const first = from || 1;
      const page = await get(`/v1/partitions/${p}/events?from=${first}&limit=${PAGE}`);
      const prev = Math.max(1, first - PAGE);
      box.replaceChildren(
        h('p', {}, `offsets from ${first}; the partition's end is ${page.end} (every offset below it is final)`),
        h('p', {}, first > 1 ? h('a', { href: `#/partition/${p}/${prev}` }, '← older') : '', ' ',
          page.next < page.end ? h('a', { href: `#/partition/${p}/${page.next}`, id: 'newer' }, 'newer →') : h('span', { class: 'muted' }, 'at the end')),
        page.events.length ? table(EVENT_HEAD, page.events.map(eventRow), gapClass(page.events))
          : h('p', { class: 'muted' }, 'No events from this offset.'));
    } catch (e) { if (!(e instanceof Down)) box.replaceChildren(errorBox(e)); }
  })();
}

function stopLive() {
  if (S.live) { S.live.stop = true; if (S.live.ctl) S.live.ctl.abort(); S.live = null; }
}

// Follows the partition's SSE tail (fetch, so the token goes in a header), keeping the last
// LIVE_WINDOW events and redrawing at most once per animation frame.
function follow(p, box) {
  const live = { stop: false, ctl: null, events: [], received: 0, next: null, drawn: false };
  S.live = live;
  const status = h('p', { id: 'live-status' }, 'connecting…');
  const body = h('div', { id: 'live' });
  box.replaceChildren(status, body);
  const draw = () => {
    live.drawn = false;
    if (live.stop) return;
    status.textContent = `following live: ${live.received} events received, next offset ${live.next}; the last ${live.events.length} shown (newest first)`;
    const rows = live.events.slice().reverse();
    body.replaceChildren(table(EVENT_HEAD, rows.map(eventRow), gapClass(rows)));
  };
  const take = (kind, data) => {
    if (kind === 'event' || kind === 'gap') {
      const v = JSON.parse(data);
      live.events.push(kind === 'gap' ? { gap: v } : v);
      if (live.events.length > LIVE_WINDOW) live.events.splice(0, live.events.length - LIVE_WINDOW);
      live.received++;
      live.next = kind === 'gap' ? v.to + 1 : v.plog_offset + 1;
    } else if (kind === 'heartbeat') {
      const v = JSON.parse(data);
      if (live.next === null) live.next = v.next;
    } else if (kind === 'slow_follower') {
      live.next = JSON.parse(data).resume_from;
    }
    if (!live.drawn) { live.drawn = true; requestAnimationFrame(draw); }
  };
  const connect = async () => {
    while (!live.stop) {
      try {
        if (live.next === null) live.next = await partitionEnd(p);
        live.ctl = new AbortController();
        const r = await fetch(`/v1/partitions/${p}/events/stream?from=${live.next}`,
          { headers: headers({ Accept: 'text/event-stream' }), signal: live.ctl.signal, cache: 'no-store' });
        if (r.status === 401) { login('The server refused the token.'); return; }
        if (!r.ok) throw new Error(`the tail answered ${r.status}`);
        nodeUp();
        status.textContent = `following live from offset ${live.next}`;
        const reader = r.body.getReader();
        const dec = new TextDecoder();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done || live.stop) break;
          buf += dec.decode(value, { stream: true });
          let cut;
          while ((cut = buf.indexOf('\n\n')) >= 0) {
            const msg = buf.slice(0, cut); buf = buf.slice(cut + 2);
            let kind = 'message', data = '';
            for (const line of msg.split('\n')) {
              if (line.startsWith('event:')) kind = line.slice(6).trim();
              else if (line.startsWith('data:')) data += line.slice(5).trim();
            }
            if (data) take(kind, data);
          }
        }
      } catch (e) {
        if (live.stop) return;
        if (e instanceof TypeError) nodeDown(`this node (${location.host}) does not answer: ${e.message}`);
        status.textContent = `the tail ended (${e.message || e}); reconnecting…`;
      }
      if (!live.stop) await new Promise((res) => setTimeout(res, POLL_MS));
    }
  };
  connect();
}

// ---------------------------------------------------------------- a workspace

function workspace(args) {
  const ws = args[0] || '';
  const from = Number(args[1] || 1);
  const wsIn = h('input', { type: 'number', min: 0, value: ws, id: 'ws', placeholder: 'workspace ID' });
  const idIn = h('input', { type: 'number', min: 1, id: 'record-id', placeholder: 'record ID' });
  const record = h('div', { id: 'record' });
  const box = h('div', { id: 'wlog' });
  show(h('h2', {}, ws ? `Workspace ${ws}` : 'Workspace'),
    h('form', { class: 'inline', onsubmit: (ev) => { ev.preventDefault(); location.hash = `#/workspace/${wsIn.value}`; } },
      'workspace', wsIn, h('button', { type: 'submit' }, 'Show WLog')),
    ws ? h('form', { class: 'inline', onsubmit: async (ev) => {
      ev.preventDefault();
      try { record.replaceChildren(json(await get(`/v1/workspaces/${ws}/records/${idIn.value}`))); } catch (e) { if (!(e instanceof Down)) record.replaceChildren(errorBox(e)); }
    } }, 'record', idIn, h('button', { type: 'submit' }, 'Show record')) : '',
    record, box);
  if (!ws) return;
  (async () => {
    try {
      const page = await get(`/v1/workspaces/${ws}/wlog?from=${from}&limit=${PAGE}`);
      const rows = page.events.map((e) => [num(e.wlog_offset), h('a', { href: `#/partition/0/${e.plog_offset}` }, String(e.plog_offset)),
        e.command, new Date(e.registered_at_ms).toISOString(),
        json({ argument: e.argument, created: e.created, updated: e.updated })]);
      box.replaceChildren(h('h3', {}, `WLog from ${from}`),
        h('p', {}, from > 1 ? h('a', { href: `#/workspace/${ws}/${Math.max(1, from - PAGE)}` }, '← older') : '', ' ',
          page.events.length === PAGE ? h('a', { href: `#/workspace/${ws}/${from + PAGE}` }, 'newer →') : ''),
        rows.length ? table(['WLog', 'PLog', 'command', 'registered', 'body'], rows) : h('p', { class: 'muted' }, 'No events.'));
    } catch (e) { if (!(e instanceof Down)) box.replaceChildren(errorBox(e)); }
  })();
}

// ---------------------------------------------------------------- consumers and groups

const canWrite = () => S.scope === 'write' || S.scope === 'admin';

// The view is drawn again every second, so the first click's arming lives in
// S.armed, not in the button: a redraw between two clicks must not disarm it.
function deleteButton(name) {
  const ask = `Really delete ${name}?`;
  const b = h('button', { class: 'danger', 'data-consumer': name, onclick: async () => {
    if (!S.armed.has(name)) { S.armed.add(name); b.textContent = ask; return; }
    S.armed.delete(name);
    b.disabled = true;
    try {
      const r = await call(`/v1/consumers/${encodeURIComponent(name)}`, { method: 'DELETE' });
      b.textContent = r.ok ? 'deleted' : `refused (${r.status})`;
    } catch (e) { b.textContent = 'failed'; }
  } }, S.armed.has(name) ? ask : 'Delete consumer');
  return b;
}

const CONSUMERS_KEY = 'monoseq.consumers';

// Without GET /v1/consumers: the consumers named in this browser, each from
// GET /v1/consumers/{name}, its lag against each partition's end.
async function namedConsumers() {
  const names = JSON.parse(localStorage.getItem(CONSUMERS_KEY) || '[]');
  const ends = new Map();
  const out = [];
  for (const name of names) {
    const body = await getOptional(`/v1/consumers/${encodeURIComponent(name)}`);
    const partitions = [];
    for (const p of (body ? body.partitions : [])) {
      if (!ends.has(p.partition)) ends.set(p.partition, await partitionEnd(p.partition));
      const end = ends.get(p.partition);
      partitions.push({ partition: p.partition, offset: p.offset, end, lag: Math.max(0, end - 1 - p.offset) });
    }
    out.push({ name, partitions });
  }
  return out;
}

function consumerTables(list, deletable) {
  const out = [];
  for (const c of list) {
    const rows = c.partitions.map((p) => {
      const key = `${c.name}/${p.partition}`;
      const hist = S.lag.get(key) || [];
      hist.push(p.lag);
      if (hist.length > LAG_SAMPLES) hist.shift();
      S.lag.set(key, hist);
      return [num(p.partition), num(p.offset), num(p.end),
        h('td', { class: 'num lag', 'data-consumer': c.name, 'data-partition': p.partition }, String(p.lag)),
        spark(hist)];
    });
    out.push(h('h3', {}, `consumer ${c.name} `, deletable && canWrite() ? deleteButton(c.name) : ''));
    out.push(rows.length ? table(['partition', 'position', 'end', 'lag (events)', 'lag, last minutes'], rows)
      : h('p', { class: 'muted' }, 'No position stored.'));
  }
  return out;
}

function consumers() {
  const name = h('input', { id: 'consumer-name', placeholder: 'consumer name' });
  const form = h('form', { class: 'inline', id: 'consumer-form', hidden: true, onsubmit: (ev) => {
    ev.preventDefault();
    const names = JSON.parse(localStorage.getItem(CONSUMERS_KEY) || '[]').filter((n) => n !== name.value.trim());
    names.push(name.value.trim());
    localStorage.setItem(CONSUMERS_KEY, JSON.stringify(names));
    name.value = '';
  } }, 'watch consumer', name, h('button', { type: 'submit' }, 'Add'));
  show(h('h2', {}, 'Consumers and groups'), form, h('div', { id: 'consumers' }, 'Loading…'), h('div', { id: 'groups' }));
  every(async () => {
    const list = await getOptional('/v1/consumers');
    const out = [];
    form.hidden = list !== null;
    if (list === null) {
      out.push(h('p', { class: 'muted' }, 'This server does not list its consumers: name the ones to watch (kept in this browser).'));
      out.push(...consumerTables(await namedConsumers(), false));
    } else if (!list.consumers.length) {
      out.push(h('p', { class: 'muted' }, 'No consumer has stored a position.'));
    } else {
      out.push(...consumerTables(list.consumers, true));
      if (list.truncated) out.push(h('p', { class: 'muted' }, 'More consumers are stored than listed.'));
    }
    document.getElementById('consumers').replaceChildren(...out);
    const groups = await getOptional('/v1/groups');
    const gout = [h('h3', {}, 'Groups')];
    if (groups === null) {
      gout.push(h('p', { class: 'muted' }, 'This server has no consumer groups (GET /v1/groups is not there).'));
    } else if (!groups.groups.length) {
      gout.push(h('p', { class: 'muted' }, 'No group.'));
    } else {
      for (const g of groups.groups) {
        const d = await getOptional(`/v1/groups/${encodeURIComponent(g.group)}`);
        gout.push(h('h3', {}, `group ${g.group} (generation ${g.generation}, ${g.members} members)`));
        if (!d) continue;
        gout.push(table(['member', 'session', 'node', 'partitions'],
          d.members.map((m) => [m.member, m.session, m.node, m.partitions.join(', ')])));
        gout.push(table(['partition', 'member', 'state', 'position', 'end', 'lag'],
          d.partitions.map((p) => [num(p.partition), p.member || '—', p.state, num(p.offset), num(p.end), num(p.lag)])));
      }
    }
    document.getElementById('groups').replaceChildren(...gout);
  });
}

// ---------------------------------------------------------------- named sequences

const WATCH_KEY = 'monoseq.sequences';

function sequences() {
  const watched = () => JSON.parse(localStorage.getItem(WATCH_KEY) || '[]');
  const addr = h('input', { id: 'sequence', placeholder: 'scope/name', size: 30 });
  const box = h('div', { id: 'sequence-values' });
  show(h('h2', {}, 'Named sequences'),
    h('form', { class: 'inline', onsubmit: (ev) => {
      ev.preventDefault();
      const list = watched().filter((a) => a !== addr.value.trim());
      list.push(addr.value.trim());
      localStorage.setItem(WATCH_KEY, JSON.stringify(list));
      addr.value = '';
    } }, 'watch', addr, h('button', { type: 'submit' }, 'Add')),
    h('p', { class: 'muted' }, 'Sequences are looked up by address (scope/name); the ones you watch are kept in this browser.'),
    box);
  every(async () => {
    const list = watched();
    const values = await Promise.all(list.map((a) =>
      get(`/v1/sequences/${a.split('/').map(encodeURIComponent).join('/')}/value`).then((v) => v.value, (e) => {
        if (e instanceof Down) throw e;
        return e instanceof Refused && e.status === 404 ? 'does not exist' : `error: ${e.message}`;
      })));
    box.replaceChildren(list.length ? table(['sequence', 'value', ''], list.map((a, i) => [a, num(values[i] === null ? 'not set' : values[i]),
      h('button', { onclick: () => localStorage.setItem(WATCH_KEY, JSON.stringify(watched().filter((x) => x !== a))) }, 'Stop watching')]))
      : h('p', { class: 'muted' }, 'No sequence watched.'));
  });
}

// ---------------------------------------------------------------- health

// Prometheus text: name -> [{labels, value}]
function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[3] || '').matchAll(/([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value: Number(m[4]) });
  }
  return out;
}

// The embedded engine's memory and background work (none on PostgreSQL).
function engineRows(ms) {
  if (!ms.has('monoseq_engine_memtable_bytes')) return [];
  const mib = (name) => {
    const v = sum(ms, name);
    return v < 1048576 ? `${(v / 1024).toFixed(1)} KiB` : `${(v / 1048576).toFixed(1)} MiB`;
  };
  return [
    ['embedded engine: memtables', h('td', { id: 'engine-memtables' },
      `${mib('monoseq_engine_memtable_bytes')}, ${sum(ms, 'monoseq_engine_sealed_memtables')} waiting for their flush`)],
    ['embedded engine: block cache', `${mib('monoseq_engine_cache_bytes')} of ${mib('monoseq_engine_cache_capacity_bytes')}`],
    ['embedded engine: tables', `${sum(ms, 'monoseq_engine_tables')}, ${sum(ms, 'monoseq_engine_level0_tables')} in level 0; `
      + `${sum(ms, 'monoseq_engine_compactions_running')} compactions running`],
  ];
}

function sum(ms, name, pred) {
  return (ms.get(name) || []).filter((s) => !pred || pred(s.labels)).reduce((a, s) => a + s.value, 0);
}

// Buckets of histogram `name` (filtered by `pred`) summed over its series: [[le, count]].
function buckets(ms, name, pred) {
  const by = new Map();
  for (const s of ms.get(`${name}_bucket`) || []) {
    if (pred && !pred(s.labels)) continue;
    const le = s.labels.le === '+Inf' ? Infinity : Number(s.labels.le);
    by.set(le, (by.get(le) || 0) + s.value);
  }
  return [...by.entries()].sort((a, b) => a[0] - b[0]);
}

// The q-quantile of cumulative buckets, interpolated inside its bucket (as PromQL does).
function quantile(q, bs) {
  if (!bs.length) return null;
  const total = bs[bs.length - 1][1];
  if (total <= 0) return null;
  const rank = q * total;
  let prevLe = 0, prevCount = 0;
  for (const [le, count] of bs) {
    if (count >= rank) {
      if (le === Infinity) return prevLe;
      return prevLe + (le - prevLe) * ((rank - prevCount) / Math.max(1e-9, count - prevCount));
    }
    prevLe = le; prevCount = count;
  }
  return prevLe;
}

function minus(now, before) {
  if (!before) return now;
  const old = new Map(before);
  return now.map(([le, c]) => [le, c - (old.get(le) || 0)]);
}

const secs = (v) => (v === null ? '—' : v < 0.001 ? `${(v * 1e6).toFixed(0)} µs` : v < 1 ? `${(v * 1000).toFixed(2)} ms` : `${v.toFixed(2)} s`);

const LATENCIES = [
  ['commands (ok)', 'monoseq_command_duration_seconds', (l) => l.outcome === 'ok'],
  ['group append', 'monoseq_group_write_duration_seconds'],
  ['group sync', 'monoseq_group_sync_duration_seconds'],
  ['forwarding', 'monoseq_forward_duration_seconds'],
  ['page read', 'monoseq_page_read_duration_seconds'],
  ['follower delay', 'monoseq_follower_delay_seconds'],
];

function health() {
  show(h('h2', {}, 'Health'), h('div', { id: 'health' }, 'Loading…'));
  every(async () => {
    const r = await call('/metrics');
    if (!r.ok) throw new Refused(r.status);
    const ms = parseMetrics(await r.text());
    const ready = await readiness();
    const now = performance.now();
    const commands = sum(ms, 'monoseq_commands_total');
    const prev = S.counts;
    const sample = { t: now, commands, hist: new Map(LATENCIES.map(([label, name, pred]) => [label, buckets(ms, name, pred)])) };
    S.counts = sample;
    const dt = prev ? (now - prev.t) / 1000 : 0;
    const perSecond = prev && dt > 0 ? ((commands - prev.commands) / dt).toFixed(1) : '—';
    const rows = LATENCIES.map(([label]) => {
      const all = sample.hist.get(label);
      const recent = minus(all, prev && prev.hist.get(label));
      const count = all.length ? all[all.length - 1][1] : 0;
      const useRecent = recent.length && recent[recent.length - 1][1] > 0;
      const bs = useRecent ? recent : all;
      return [label, h('td', { class: 'num', 'data-latency': label }, secs(quantile(0.5, bs))), num(secs(quantile(0.99, bs))), num(count),
        useRecent ? 'last second' : 'since start'];
    });
    const fatal = (ms.get('monoseq_storage_fatal') || []).filter((s) => s.value > 0).map((s) => s.labels.partition);
    const out = [
      table(['', ''], [
        ['commands/s (all outcomes)', h('td', { class: 'num', id: 'rate' }, perSecond)],
        ['partitions served here', num(sum(ms, 'monoseq_owned_partitions'))],
        ['partitions not serving', num(sum(ms, 'monoseq_unavailable_partitions'))],
        ['storage', h('td', { id: 'storage', class: fatal.length ? 'bad' : 'state-serving' },
          fatal.length ? `failed fatally on partitions ${fatal.join(', ')} (restart the server; /readyz names the failure)` : 'healthy')],
        ['readiness', ready.ready ? 'ready' : ready.message],
        ['unflushed sequence values', num(sum(ms, 'monoseq_backlog_values'))],
        ['live tails', num(sum(ms, 'monoseq_followers'))],
        ...engineRows(ms),
      ]),
      h('h3', {}, 'Latency (from the /metrics histograms)'),
      table(['', 'p50', 'p99', 'count', 'over'], rows),
    ];
    if (ready.reasons.size) {
      out.push(h('h3', {}, 'Last engine errors and other reasons'));
      out.push(table(['partition', 'reason'], [...ready.reasons.entries()].map(([p, why]) => [num(p), why])));
    }
    document.getElementById('health').replaceChildren(...out);
  });
}

window.addEventListener('hashchange', route);
window.addEventListener('DOMContentLoaded', route);
