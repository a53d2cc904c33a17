// Magnetar console: one page, vanilla JavaScript, no dependencies, no build step.
//
// Everything it shows comes from the admin REST API pulsar-admin uses (/admin/v2/...) plus the
// broker's recent history (/console/api/history) for the charts. Views refresh every
// REFRESH_MS; tables are updated in place (rows keyed by name), so a button does not move or
// vanish under the pointer between two refreshes.
//
// Authentication: a token typed in the login form is kept in sessionStorage and sent as
// `Authorization: Bearer <token>` on every request; any 401 hides everything but the login.
'use strict';

(() => {
  const TOKEN_KEY = 'magnetar.console.token';
  const REFRESH_MS = 2000;
  const PAGE_SIZE = 50;
  // Stats requests in flight at once when a namespace page is refreshed.
  const STATS_CONCURRENCY = 6;
  // Partitions whose series are added up for a partitioned topic's charts.
  const MAX_CHART_PARTITIONS = 32;
  const COLORS = { in: '#5b3fe0', out: '#1d8a4c', backlog: '#d9822b', storage: '#2a7ab8', redeliver: '#c62f3b' };

  const $ = (id) => document.getElementById(id);
  const enc = encodeURIComponent;

  // ------------------------------------------------------------------------ DOM helpers

  // h('td', {class: 'num'}, 'text', child): an element; strings become text nodes (never HTML).
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
      else if (key === 'dataset') Object.assign(el.dataset, value);
      else el.setAttribute(key, value === true ? '' : String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  // Sets a cell's text and keeps the raw value in data-value (what tests and sorting read).
  function setValue(el, value, format) {
    const raw = value === undefined || value === null ? '' : String(value);
    if (el.dataset.value !== raw || el.textContent === '') {
      el.dataset.value = raw;
      el.textContent = raw === '' ? '–' : format(value);
    }
  }

  // Updates tbody's rows to `items` in order: rows are keyed, built once, updated in place.
  function syncRows(tbody, items, keyOf, build, update, emptyText, columns) {
    const existing = new Map();
    for (const row of Array.from(tbody.rows)) {
      if (row.dataset.key !== undefined) existing.set(row.dataset.key, row);
      else row.remove();
    }
    let previous = null;
    for (const item of items) {
      const key = keyOf(item);
      let row = existing.get(key);
      if (row) existing.delete(key);
      else {
        row = build(item);
        row.dataset.key = key;
      }
      update(row, item);
      const wanted = previous ? previous.nextSibling : tbody.firstChild;
      if (wanted !== row) tbody.insertBefore(row, wanted);
      previous = row;
    }
    for (const row of existing.values()) row.remove();
    if (items.length === 0) tbody.append(h('tr', { class: 'empty' }, h('td', { colspan: columns }, emptyText)));
  }

  // ------------------------------------------------------------------------ formatting

  function fmtCount(n) {
    return Number(n).toLocaleString('en-US');
  }

  function fmtRate(n) {
    const v = Number(n);
    if (!Number.isFinite(v) || v === 0) return '0';
    if (Math.abs(v) < 10) return v.toFixed(2);
    if (Math.abs(v) < 1000) return v.toFixed(1);
    const units = ['k', 'M', 'G', 'T'];
    let scaled = v;
    let unit = '';
    for (const u of units) {
      if (Math.abs(scaled) < 1000) break;
      scaled /= 1000;
      unit = u;
    }
    return scaled.toFixed(scaled < 10 ? 2 : 1) + unit;
  }

  function fmtBytes(n) {
    let v = Number(n);
    if (!Number.isFinite(v)) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) {
      v /= 1024;
      i += 1;
    }
    return (i === 0 ? String(Math.round(v)) : v.toFixed(v < 10 ? 2 : 1)) + ' ' + units[i];
  }

  const fmtByteRate = (n) => fmtBytes(n) + '/s';

  function fmtTime(ms) {
    const d = new Date(ms);
    const two = (x) => String(x).padStart(2, '0');
    return two(d.getHours()) + ':' + two(d.getMinutes()) + ':' + two(d.getSeconds());
  }

  // ------------------------------------------------------------------------ API

  class ApiError extends Error {
    constructor(status, reason) {
      super(reason);
      this.status = status;
    }
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || '';
  }

  // One request to the broker; the admin API's `reason` becomes the error's message.
  async function api(method, path, body) {
    const headers = { Accept: 'application/json' };
    if (token()) headers.Authorization = 'Bearer ' + token();
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, 'Cannot reach the broker (' + e.message + ')');
    }
    const text = await response.text();
    if (response.status === 401) {
      showLogin(token() ? 'The token was refused.' : 'This broker asks for a token.');
      throw new ApiError(401, reasonOf(text) || 'Unauthorized');
    }
    if (!response.ok) {
      throw new ApiError(response.status, reasonOf(text) || response.status + ' ' + response.statusText);
    }
    if (text === '') return null;
    const type = response.headers.get('Content-Type') || '';
    return type.includes('json') ? JSON.parse(text) : text;
  }

  function reasonOf(text) {
    try {
      const parsed = JSON.parse(text);
      if (parsed && typeof parsed.reason === 'string') return parsed.reason;
      if (parsed && typeof parsed.message === 'string') return parsed.message;
    } catch (_) {
      // not JSON: the body itself, if short enough to be a message
    }
    return text && text.length < 300 ? text : '';
  }

  // Runs `work` on every item with at most `limit` in flight; results in order.
  async function pool(items, limit, work) {
    const results = new Array(items.length);
    let next = 0;
    async function worker() {
      while (next < items.length) {
        const i = next;
        next += 1;
        try {
          results[i] = { ok: true, value: await work(items[i]) };
        } catch (e) {
          if (e.status === 401) throw e;
          results[i] = { ok: false, error: e };
        }
      }
    }
    await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
    return results;
  }

  // ------------------------------------------------------------------------ names and paths

  // persistent://tenant/namespace/local -> parts; null when not a topic name.
  function parseTopic(full) {
    const m = /^(persistent|non-persistent):\/\/([^/]+)\/([^/]+)\/(.+)$/.exec(full);
    return m ? { domain: m[1], tenant: m[2], namespace: m[3], local: m[4], full } : null;
  }

  function topicPath(t) {
    return '/admin/v2/' + t.domain + '/' + enc(t.tenant) + '/' + enc(t.namespace) + '/' + enc(t.local);
  }

  function topicHash(t) {
    return '#/topic/' + t.domain + '/' + enc(t.tenant) + '/' + enc(t.namespace) + '/' + enc(t.local);
  }

  function namespaceHash(tenant, namespace) {
    return '#/ns/' + enc(tenant) + '/' + enc(namespace);
  }

  const PARTITION = /^(.*)-partition-(\d+)$/;

  // The topics of a namespace as the console lists them: partitioned topics once (with their
  // partition count), non-partitioned topics, and no partitions.
  async function namespaceTopics(tenant, namespace) {
    const base = enc(tenant) + '/' + enc(namespace);
    const [persistent, partitioned, nonPersistent] = await Promise.all([
      api('GET', '/admin/v2/persistent/' + base),
      api('GET', '/admin/v2/persistent/' + base + '/partitioned'),
      api('GET', '/admin/v2/non-persistent/' + base).catch(() => []),
    ]);
    const byName = new Map();
    for (const name of partitioned || []) {
      const t = parseTopic(name);
      if (t) byName.set(name, Object.assign(t, { partitions: 0 }));
    }
    for (const name of [].concat(persistent || [], nonPersistent || [])) {
      const m = PARTITION.exec(name);
      if (m && byName.has(m[1])) {
        const parent = byName.get(m[1]);
        parent.partitions = Math.max(parent.partitions, Number(m[2]) + 1);
        continue;
      }
      const t = parseTopic(name);
      if (t && !byName.has(name)) byName.set(name, Object.assign(t, { partitions: null }));
    }
    const partitionedNames = new Set(partitioned || []);
    for (const t of byName.values()) t.partitioned = partitionedNames.has(t.full);
    return Array.from(byName.values()).sort((a, b) => a.full.localeCompare(b.full));
  }

  function topicStats(t) {
    return t.partitioned
      ? api('GET', topicPath(t) + '/partitioned-stats?perPartition=false')
      : api('GET', topicPath(t) + '/stats');
  }

  // What a topic's row shows, from its (partitioned) stats.
  function summarize(stats) {
    const subscriptions = Object.values(stats.subscriptions || {});
    return {
      msgRateIn: stats.msgRateIn || 0,
      msgRateOut: stats.msgRateOut || 0,
      msgThroughputIn: stats.msgThroughputIn || 0,
      msgThroughputOut: stats.msgThroughputOut || 0,
      backlog: subscriptions.reduce((sum, s) => sum + (s.msgBacklog || 0), 0),
      storageSize: stats.storageSize || 0,
      producers: (stats.publishers || []).length,
      subscriptions: subscriptions.length,
      consumers: subscriptions.reduce((sum, s) => sum + (s.consumers || []).length, 0),
    };
  }

  // ------------------------------------------------------------------------ charts

  // A line chart on a canvas: `series` = [{key, label, color}], `points` from the history.
  function chart(title, series, format, ceiling = niceCeiling) {
    const canvas = h('canvas', { class: 'chart-canvas' });
    const values = {};
    const legend = h('div', { class: 'legend' },
      series.map((s) => {
        const swatch = h('span', { class: 'swatch' });
        swatch.style.background = s.color;
        values[s.key] = h('span', { dataset: { series: s.key } });
        return h('span', {}, swatch, s.label + ' ', values[s.key]);
      }));
    const empty = h('div', { class: 'empty' }, 'Collecting samples…');
    const el = h('div', { class: 'chart', dataset: { chart: title } }, h('h3', {}, title), legend, canvas, empty);
    let last = [];

    function draw(points) {
      last = points;
      canvas.dataset.points = String(points.length);
      empty.hidden = points.length >= 2;
      const latest = points[points.length - 1];
      for (const s of series) values[s.key].textContent = latest ? format(latest[s.key]) : '–';
      const width = canvas.clientWidth;
      const height = canvas.clientHeight;
      if (width === 0 || height === 0) return;
      const ratio = window.devicePixelRatio || 1;
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
      const ctx = canvas.getContext('2d');
      ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
      ctx.clearRect(0, 0, width, height);
      const pad = { left: 64, right: 8, top: 10, bottom: 18 };
      const plotW = width - pad.left - pad.right;
      const plotH = height - pad.top - pad.bottom;
      let max = 0;
      for (const p of points) for (const s of series) max = Math.max(max, Number(p[s.key]) || 0);
      max = ceiling(max);
      const t0 = points.length ? points[0].timeMs : 0;
      const t1 = points.length ? points[points.length - 1].timeMs : 1;
      const span = Math.max(t1 - t0, 1);
      const x = (t) => pad.left + ((t - t0) / span) * plotW;
      const y = (v) => pad.top + plotH - (v / max) * plotH;

      ctx.font = '11px system-ui, sans-serif';
      ctx.strokeStyle = '#e2e5ee';
      ctx.fillStyle = '#6b7185';
      ctx.lineWidth = 1;
      ctx.textAlign = 'right';
      ctx.textBaseline = 'middle';
      for (let i = 0; i <= 4; i += 1) {
        const v = (max * i) / 4;
        const yy = Math.round(y(v)) + 0.5;
        ctx.beginPath();
        ctx.moveTo(pad.left, yy);
        ctx.lineTo(pad.left + plotW, yy);
        ctx.stroke();
        ctx.fillText(format(v), pad.left - 6, yy);
      }
      if (points.length >= 2) {
        ctx.textBaseline = 'top';
        ctx.textAlign = 'left';
        ctx.fillText(fmtTime(t0), pad.left, pad.top + plotH + 4);
        ctx.textAlign = 'right';
        ctx.fillText(fmtTime(t1), pad.left + plotW, pad.top + plotH + 4);
      }
      ctx.lineWidth = 1.75;
      for (const s of series) {
        ctx.strokeStyle = s.color;
        ctx.beginPath();
        points.forEach((p, i) => {
          const px = x(p.timeMs);
          const py = y(Number(p[s.key]) || 0);
          if (i === 0) ctx.moveTo(px, py);
          else ctx.lineTo(px, py);
        });
        ctx.stroke();
      }
    }

    window.addEventListener('resize', () => draw(last));
    return { el, draw };
  }

  // The smallest 1, 2 or 5 times a power of ten at or above v (at least 1).
  function niceCeiling(v) {
    if (!(v > 0)) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(v)));
    for (const step of [1, 2, 5, 10]) if (step * power >= v) return step * power;
    return 10 * power;
  }

  // The same for bytes, in the unit the axis labels use (KiB, MiB, ...).
  function niceBytes(v) {
    if (!(v > 0)) return 1;
    const unit = Math.pow(1024, Math.max(0, Math.floor(Math.log(v) / Math.log(1024))));
    return niceCeiling(v / unit) * unit;
  }

  function rateCharts() {
    return [
      chart('Messages per second',
        [{ key: 'msgRateIn', label: 'in', color: COLORS.in }, { key: 'msgRateOut', label: 'out', color: COLORS.out }],
        fmtRate),
      chart('Throughput',
        [{ key: 'msgThroughputIn', label: 'in', color: COLORS.in }, { key: 'msgThroughputOut', label: 'out', color: COLORS.out }],
        fmtByteRate, niceBytes),
      chart('Backlog (messages)', [{ key: 'msgBacklog', label: 'backlog', color: COLORS.backlog }], fmtCount),
      chart('Storage', [{ key: 'storageSize', label: 'size', color: COLORS.storage }], fmtBytes, niceBytes),
    ];
  }

  // ------------------------------------------------------------------------ cards

  function cards(defs) {
    const values = {};
    const el = h('section', { class: 'cards' },
      defs.map(([key, label]) => {
        values[key] = h('div', { class: 'value', id: 'stat-' + key });
        return h('div', { class: 'card' }, h('div', { class: 'label' }, label), values[key]);
      }));
    const set = (data) => {
      for (const [key, , format] of defs) setValue(values[key], data[key], format);
    };
    return { el, set };
  }

  // ------------------------------------------------------------------------ dialogs

  // A confirmation dialog. `fields`: [{name, label, type, value, min}]; `run(values)` performs
  // the operation; on failure the admin API's reason is shown and the dialog stays open.
  function confirmDialog({ title, message, fields = [], confirm = 'Confirm', danger = false, run }) {
    const dialog = $('dialog');
    const ok = $('dialog-ok');
    const error = $('dialog-error');
    $('dialog-title').textContent = title;
    const inputs = {};
    const body = [];
    if (message) body.push(h('p', {}, message));
    for (const f of fields) {
      const input = h('input', {
        id: 'dialog-field-' + f.name,
        type: f.type || 'text',
        min: f.min,
        step: f.step,
        value: f.type === 'checkbox' ? undefined : f.value,
        required: f.required,
      });
      if (f.type === 'checkbox') {
        input.checked = Boolean(f.value);
        body.push(h('label', { class: 'check' }, input, ' ' + f.label));
      } else {
        body.push(h('label', { for: input.id }, f.label), input);
      }
      inputs[f.name] = input;
    }
    $('dialog-body').replaceChildren(...body);
    error.hidden = true;
    error.textContent = '';
    ok.textContent = confirm;
    ok.className = danger ? 'danger' : 'primary';
    ok.disabled = false;

    $('dialog-form').onsubmit = async (event) => {
      event.preventDefault();
      const values = {};
      for (const [name, input] of Object.entries(inputs)) {
        values[name] = input.type === 'checkbox' ? input.checked : input.value;
      }
      ok.disabled = true;
      error.hidden = true;
      try {
        const done = await run(values);
        dialog.close();
        if (done) notify(done);
        refreshSoon();
      } catch (e) {
        if (e.status === 401) {
          dialog.close();
          return;
        }
        error.textContent = e.message || String(e);
        error.hidden = false;
      } finally {
        ok.disabled = false;
      }
    };
    $('dialog-cancel').onclick = () => dialog.close();
    dialog.showModal();
    const first = Object.values(inputs)[0];
    (first || ok).focus();
  }

  let bannerTimer = null;

  function notify(text, isError) {
    const banner = $('banner');
    banner.textContent = text;
    banner.className = 'banner' + (isError ? ' error' : '');
    banner.hidden = false;
    clearTimeout(bannerTimer);
    bannerTimer = setTimeout(() => { banner.hidden = true; }, isError ? 8000 : 4000);
  }

  // ------------------------------------------------------------------------ views

  // Overview: brokers, totals, charts over the broker's recent history.
  function overviewView() {
    const summary = cards([
      ['brokers', 'Brokers', fmtCount],
      ['topics', 'Topics (loaded)', fmtCount],
      ['producers', 'Producers', fmtCount],
      ['consumers', 'Consumers', fmtCount],
      ['msgRateIn', 'Messages in /s', fmtRate],
      ['msgRateOut', 'Messages out /s', fmtRate],
      ['msgThroughputIn', 'Bytes in /s', fmtByteRate],
      ['msgThroughputOut', 'Bytes out /s', fmtByteRate],
      ['msgBacklog', 'Backlog (messages)', fmtCount],
      ['storageSize', 'Storage used', fmtBytes],
    ]);
    const charts = rateCharts();
    const brokers = h('tbody');
    const el = h('div', { id: 'view-overview' },
      h('h1', {}, 'Overview'),
      summary.el,
      h('section', { class: 'charts' }, charts.map((c) => c.el)),
      h('h2', {}, 'Brokers'),
      h('table', { id: 'brokers' }, h('thead', {}, h('tr', {}, h('th', {}, 'Broker'), h('th', {}, 'Cluster'))), brokers));

    async function refresh() {
      const [history, clusters] = await Promise.all([
        api('GET', '/console/api/history'),
        api('GET', '/admin/v2/clusters'),
      ]);
      const lists = await Promise.all((clusters || []).map((c) =>
        api('GET', '/admin/v2/brokers/' + enc(c)).then((list) => (list || []).map((b) => ({ broker: b, cluster: c })))));
      const all = lists.flat();
      $('cluster-name').textContent = (clusters || []).join(', ');
      const points = (history && history.points) || [];
      const latest = points[points.length - 1] || {};
      summary.set(Object.assign({}, latest, { brokers: all.length }));
      for (const c of charts) c.draw(points);
      syncRows(brokers, all, (b) => b.broker,
        () => h('tr', {}, h('td', {}), h('td', {})),
        (row, b) => {
          row.cells[0].textContent = b.broker;
          row.cells[1].textContent = b.cluster;
        }, 'No broker registered', 2);
    }
    return { el, refresh };
  }

  // Storage nodes: each node's state, free disk and drain, the auto-recovery auditor and the
  // under-replicated ledgers; a node can be decommissioned (drained) or its drain called off.
  function storageView() {
    const summary = cards([
      ['nodes', 'Storage nodes', fmtCount],
      ['up', 'Up', fmtCount],
      ['auditor', 'Auditor (node)', String],
      ['underReplicatedLedgers', 'Under-replicated ledgers', fmtCount],
      ['draining', 'Draining', fmtCount],
    ]);
    const nodes = h('tbody');
    const ledgers = h('tbody');
    const el = h('div', { id: 'view-storage' },
      h('h1', {}, 'Storage nodes'),
      summary.el,
      h('table', { id: 'storage-nodes' },
        h('thead', {}, h('tr', {},
          h('th', {}, 'Node'), h('th', {}, 'Address'), h('th', {}, 'State'),
          h('th', { class: 'num' }, 'Free disk'), h('th', {}, 'Rack'), h('th', {}, 'Decommission'),
          h('th', { class: 'num' }, 'Ledgers left'), h('th', {}, ''))),
        nodes),
      h('h2', {}, 'Under-replicated ledgers'),
      h('table', { id: 'under-replicated' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Ledger'), h('th', {}, 'Copies moving off nodes'))),
        ledgers));

    const path = (n) => '/admin/v2/bookies/' + enc(String(n.nodeId)) + '/decommission';

    function decommission(n) {
      confirmDialog({
        title: 'Decommission storage node',
        message: 'Drain node ' + n.nodeId + ' (' + n.bookieId + ')? It turns read-only and auto-recovery copies everything it holds to other nodes; once drained, stop it and remove it.',
        confirm: 'Decommission',
        danger: true,
        run: async () => {
          await api('PUT', path(n));
          return 'Node ' + n.nodeId + ' is being decommissioned';
        },
      });
    }

    function cancel(n) {
      confirmDialog({
        title: 'Call the drain off',
        message: 'Stop decommissioning node ' + n.nodeId + '? It takes adds again; what moved stays moved.',
        confirm: 'Call off',
        run: async () => {
          await api('DELETE', path(n));
          return 'Node ' + n.nodeId + ' takes adds again';
        },
      });
    }

    async function refresh() {
      const view = await api('GET', '/admin/v2/bookies/autorecovery');
      const all = (view && view.nodes) || [];
      summary.set({
        nodes: all.length,
        up: all.filter((n) => n.state !== 'down').length,
        auditor: view.auditor === null || view.auditor === undefined ? undefined : view.auditor,
        underReplicatedLedgers: view.underReplicatedLedgers,
        draining: all.filter((n) => n.decommission && n.decommission.state === 'draining').length,
      });
      syncRows(nodes, all, (n) => String(n.nodeId),
        (n) => h('tr', {}, h('td', {}), h('td', {}), h('td', { class: 'state' }), h('td', { class: 'num' }),
          h('td', {}), h('td', { class: 'decommission' }), h('td', { class: 'num' }), h('td', {},
            h('button', { type: 'button', class: 'drain', onclick: () => decommission(n) }, 'Decommission'),
            h('button', { type: 'button', class: 'cancel-drain', onclick: () => cancel(n) }, 'Call off'))),
        (row, n) => {
          row.cells[0].textContent = String(n.nodeId);
          row.cells[1].textContent = n.bookieId;
          row.cells[2].textContent = n.state;
          setValue(row.cells[3], n.freeBytes, fmtBytes);
          row.cells[4].textContent = n.rack || '';
          const d = n.decommission;
          row.cells[5].textContent = d ? d.state : '';
          setValue(row.cells[6], d ? d.closedLedgers + d.openLedgers : undefined, fmtCount);
          row.querySelector('.drain').hidden = Boolean(d);
          row.querySelector('.cancel-drain').hidden = !d;
        }, 'No storage node (this broker keeps its ledgers itself)', 8);
      syncRows(ledgers, view.underReplicated || [], (l) => String(l.ledger),
        () => h('tr', {}, h('td', {}), h('td', {})),
        (row, l) => {
          row.cells[0].textContent = String(l.ledger);
          row.cells[1].textContent = (l.nodes || []).join(', ');
        }, 'None: every ledger has its copies', 2);
    }
    return { el, refresh };
  }

  // A namespace: its topics (filtered, a page at a time) with their rates and backlog.
  function namespaceView(tenant, namespace) {
    let page = 0;
    const filter = h('input', { id: 'topic-filter', type: 'search', placeholder: 'Filter topics' });
    const pageInfo = h('span', { id: 'topic-page', class: 'muted' });
    const prev = h('button', { type: 'button', id: 'page-prev', onclick: () => { page -= 1; refreshSoon(); } }, '‹ Previous');
    const next = h('button', { type: 'button', id: 'page-next', onclick: () => { page += 1; refreshSoon(); } }, 'Next ›');
    filter.addEventListener('input', () => { page = 0; refreshSoon(); });
    const create = h('button', { type: 'button', id: 'create-topic', class: 'primary', onclick: createTopic }, 'Create topic');
    const rows = h('tbody');
    const columns = [
      ['msgRateIn', 'Msg/s in', fmtRate],
      ['msgRateOut', 'Msg/s out', fmtRate],
      ['msgThroughputIn', 'Bytes/s in', fmtByteRate],
      ['msgThroughputOut', 'Bytes/s out', fmtByteRate],
      ['backlog', 'Backlog', fmtCount],
      ['storageSize', 'Storage', fmtBytes],
      ['producers', 'Producers', fmtCount],
      ['subscriptions', 'Subscriptions', fmtCount],
      ['consumers', 'Consumers', fmtCount],
    ];
    const el = h('div', { id: 'view-namespace', dataset: { namespace: tenant + '/' + namespace } },
      h('h1', {}, h('span', { class: 'name' }, tenant + ' / ' + namespace)),
      h('div', { class: 'toolbar' }, filter, create, h('span', { class: 'spacer' }), pageInfo, prev, next),
      h('table', { id: 'topics' },
        h('thead', {}, h('tr', {},
          h('th', {}, 'Topic'), h('th', { class: 'num' }, 'Partitions'),
          columns.map(([, label]) => h('th', { class: 'num' }, label)))),
        rows));

    function createTopic() {
      confirmDialog({
        title: 'Create topic in ' + tenant + '/' + namespace,
        fields: [
          { name: 'name', label: 'Topic name', required: true },
          { name: 'partitions', label: 'Partitions (0: not partitioned)', type: 'number', min: 0, value: 0 },
        ],
        confirm: 'Create',
        run: async ({ name, partitions }) => {
          const n = Number(partitions || 0);
          if (!name.trim()) throw new Error('A topic needs a name');
          if (!Number.isInteger(n) || n < 0) throw new Error('Partitions must be a whole number, 0 or more');
          const t = { domain: 'persistent', tenant, namespace, local: name.trim() };
          if (n > 0) await api('PUT', topicPath(t) + '/partitions', n);
          else await api('PUT', topicPath(t));
          return 'Created persistent://' + tenant + '/' + namespace + '/' + t.local;
        },
      });
    }

    // Only the latest refresh writes: typing in the filter starts a new one at once.
    let asked = 0;

    async function refresh() {
      const mine = ++asked;
      const all = await namespaceTopics(tenant, namespace);
      if (mine !== asked) return;
      const needle = filter.value.trim().toLowerCase();
      const matching = needle ? all.filter((t) => t.full.toLowerCase().includes(needle)) : all;
      const pages = Math.max(1, Math.ceil(matching.length / PAGE_SIZE));
      page = Math.min(Math.max(page, 0), pages - 1);
      const shown = matching.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE);
      pageInfo.textContent = matching.length === 0 ? '0 topics'
        : (page * PAGE_SIZE + 1) + '–' + (page * PAGE_SIZE + shown.length) + ' of ' + matching.length + ' topics';
      prev.disabled = page === 0;
      next.disabled = page >= pages - 1;
      const stats = await pool(shown, STATS_CONCURRENCY, topicStats);
      if (mine !== asked) return;
      const items = shown.map((t, i) => ({ topic: t, summary: stats[i].ok ? summarize(stats[i].value) : null }));
      syncRows(rows, items, (item) => item.topic.full,
        (item) => h('tr', { dataset: { topic: item.topic.full } },
          h('td', { class: 'name' }, h('a', { href: topicHash(item.topic) }, item.topic.local)),
          h('td', { class: 'num', dataset: { field: 'partitions' } }),
          columns.map(([key]) => h('td', { class: 'num', dataset: { field: key } }))),
        (row, item) => {
          setValue(row.cells[1], item.topic.partitions, (n) => (n > 0 ? fmtCount(n) : '–'));
          columns.forEach(([key, , format], i) => {
            setValue(row.cells[i + 2], item.summary ? item.summary[key] : null, format);
          });
        }, needle ? 'No topic matches' : 'No topics', columns.length + 2);
    }
    return { el, refresh };
  }

  // A topic: totals, charts, producers, subscriptions (with their operations) and consumers.
  function topicView(t) {
    const summary = cards([
      ['msgRateIn', 'Messages in /s', fmtRate],
      ['msgRateOut', 'Messages out /s', fmtRate],
      ['msgThroughputIn', 'Bytes in /s', fmtByteRate],
      ['msgThroughputOut', 'Bytes out /s', fmtByteRate],
      ['backlog', 'Backlog (messages)', fmtCount],
      ['storageSize', 'Storage', fmtBytes],
      ['producers', 'Producers', fmtCount],
      ['subscriptions', 'Subscriptions', fmtCount],
    ]);
    const charts = rateCharts();
    const producers = h('tbody');
    const subscriptions = h('tbody');
    const consumers = h('tbody');
    let partitioned = null; // learned at the first refresh
    let partitions = 0;
    const kind = h('span', { class: 'muted', id: 'topic-kind' });
    const el = h('div', { id: 'view-topic', dataset: { topic: t.full } },
      h('h1', {}, h('span', { class: 'name' }, t.full), kind),
      h('div', { class: 'toolbar' },
        h('a', { href: namespaceHash(t.tenant, t.namespace) }, '‹ ' + t.tenant + '/' + t.namespace),
        h('span', { class: 'spacer' }),
        h('button', { type: 'button', id: 'unload-topic', onclick: unload }, 'Unload'),
        h('button', { type: 'button', id: 'delete-topic', class: 'danger', onclick: remove }, 'Delete')),
      summary.el,
      h('section', { class: 'charts' }, charts.map((c) => c.el)),
      h('h2', {}, 'Subscriptions'),
      h('table', { id: 'subscriptions' }, h('thead', {}, h('tr', {},
        h('th', {}, 'Subscription'), h('th', {}, 'Type'), h('th', { class: 'num' }, 'Consumers'),
        h('th', { class: 'num' }, 'Backlog'), h('th', { class: 'num' }, 'Unacked'),
        h('th', { class: 'num' }, 'Msg/s out'), h('th', { class: 'num' }, 'Redelivered/s'),
        h('th', {}, 'Operations'))), subscriptions),
      h('h2', {}, 'Producers'),
      h('table', { id: 'producers' }, h('thead', {}, h('tr', {},
        h('th', {}, 'Producer'), h('th', {}, 'Address'), h('th', { class: 'num' }, 'Msg/s in'),
        h('th', { class: 'num' }, 'Bytes/s in'), h('th', {}, 'Client'), h('th', {}, 'Connected since'))), producers),
      h('h2', {}, 'Consumers'),
      h('table', { id: 'consumers' }, h('thead', {}, h('tr', {},
        h('th', {}, 'Consumer'), h('th', {}, 'Subscription'), h('th', {}, 'Address'),
        h('th', { class: 'num' }, 'Msg/s out'), h('th', { class: 'num' }, 'Unacked'),
        h('th', { class: 'num' }, 'Permits'), h('th', {}, 'Client'))), consumers));

    const subPath = (name) => topicPath(t) + '/subscription/' + enc(name);

    function unload() {
      confirmDialog({
        title: 'Unload topic',
        message: 'Unload ' + t.full + '? Its producers and consumers reconnect and the topic is loaded afresh.',
        confirm: 'Unload',
        run: async () => {
          await api('PUT', topicPath(t) + '/unload');
          return 'Unloaded ' + t.full;
        },
      });
    }

    function remove() {
      confirmDialog({
        title: 'Delete topic',
        message: 'Delete ' + t.full + ' and all its messages and subscriptions? This cannot be undone.',
        fields: [{ name: 'force', label: 'Force: close its producers and consumers first', type: 'checkbox' }],
        confirm: 'Delete',
        danger: true,
        run: async ({ force }) => {
          const path = partitioned ? topicPath(t) + '/partitions' : topicPath(t);
          await api('DELETE', path + (force ? '?force=true' : ''));
          location.hash = namespaceHash(t.tenant, t.namespace);
          return 'Deleted ' + t.full;
        },
      });
    }

    function clearBacklog(name) {
      confirmDialog({
        title: 'Clear backlog',
        message: 'Skip every unacknowledged message of subscription "' + name + '" on ' + t.full + '?',
        confirm: 'Clear backlog',
        danger: true,
        run: async () => {
          await api('POST', subPath(name) + '/skip_all');
          return 'Backlog of ' + name + ' cleared';
        },
      });
    }

    function skip(name) {
      confirmDialog({
        title: 'Skip messages',
        message: 'Skip the next messages of subscription "' + name + '".',
        fields: [{ name: 'count', label: 'Messages to skip', type: 'number', min: 1, value: 1, required: true }],
        confirm: 'Skip',
        danger: true,
        run: async ({ count }) => {
          const n = Number(count);
          if (!Number.isInteger(n) || n < 1) throw new Error('Give a whole number of messages, 1 or more');
          await api('POST', subPath(name) + '/skip/' + n);
          return 'Skipped ' + n + ' on ' + name;
        },
      });
    }

    function resetCursor(name) {
      const tenMinutesAgo = new Date(Date.now() - 10 * 60 * 1000);
      const local = new Date(tenMinutesAgo.getTime() - tenMinutesAgo.getTimezoneOffset() * 60000)
        .toISOString().slice(0, 19);
      confirmDialog({
        title: 'Reset cursor',
        message: 'Move subscription "' + name + '" back (or forward) to the first message published at or after this time. Its consumers reconnect.',
        fields: [{ name: 'time', label: 'Time (your local time)', type: 'datetime-local', step: 1, value: local, required: true }],
        confirm: 'Reset',
        danger: true,
        run: async ({ time }) => {
          const ms = new Date(time).getTime();
          if (!Number.isFinite(ms)) throw new Error('Give a date and time');
          await api('POST', subPath(name) + '/resetcursor/' + ms);
          return 'Reset ' + name + ' to ' + new Date(ms).toLocaleString();
        },
      });
    }

    async function refresh() {
      if (partitioned === null) {
        try {
          const meta = await api('GET', topicPath(t) + '/partitions');
          partitions = (meta && meta.partitions) || 0;
        } catch (e) {
          if (e.status === 401) throw e;
          partitions = 0;
        }
        partitioned = partitions > 0;
        kind.textContent = partitioned ? partitions + ' partitions' : '';
      }
      const stats = await topicStats({ ...t, partitioned });
      const s = summarize(stats);
      summary.set(s);
      drawHistory().catch(() => {});

      const subs = Object.entries(stats.subscriptions || {}).map(([name, sub]) => ({ name, sub }));
      syncRows(subscriptions, subs, (x) => x.name,
        (x) => h('tr', { dataset: { subscription: x.name } },
          h('td', { class: 'name' }, x.name),
          h('td', { dataset: { field: 'type' } }),
          h('td', { class: 'num', dataset: { field: 'consumers' } }),
          h('td', { class: 'num', dataset: { field: 'msgBacklog' } }),
          h('td', { class: 'num', dataset: { field: 'unackedMessages' } }),
          h('td', { class: 'num', dataset: { field: 'msgRateOut' } }),
          h('td', { class: 'num', dataset: { field: 'msgRateRedeliver' } }),
          h('td', { class: 'actions' },
            h('button', { type: 'button', class: 'small', dataset: { action: 'clear-backlog' }, onclick: () => clearBacklog(x.name) }, 'Clear backlog'),
            partitioned ? null
              : h('button', { type: 'button', class: 'small', dataset: { action: 'skip' }, onclick: () => skip(x.name) }, 'Skip…'),
            h('button', { type: 'button', class: 'small', dataset: { action: 'reset-cursor' }, onclick: () => resetCursor(x.name) }, 'Reset cursor…'))),
        (row, x) => {
          row.cells[1].textContent = x.sub.type || '';
          setValue(row.cells[2], (x.sub.consumers || []).length, fmtCount);
          setValue(row.cells[3], x.sub.msgBacklog || 0, fmtCount);
          setValue(row.cells[4], x.sub.unackedMessages || 0, fmtCount);
          setValue(row.cells[5], x.sub.msgRateOut || 0, fmtRate);
          setValue(row.cells[6], x.sub.msgRateRedeliver || 0, fmtRate);
        }, 'No subscriptions', 8);

      const pubs = (stats.publishers || []).map((p, i) => ({ key: (p.producerName || '') + '#' + i, p }));
      syncRows(producers, pubs, (x) => x.key,
        () => h('tr', {}, h('td', { class: 'name' }), h('td', {}), h('td', { class: 'num' }),
          h('td', { class: 'num' }), h('td', {}), h('td', {})),
        (row, { p }) => {
          row.cells[0].textContent = p.producerName || '';
          row.cells[1].textContent = p.address || '';
          setValue(row.cells[2], p.msgRateIn || 0, fmtRate);
          setValue(row.cells[3], p.msgThroughputIn || 0, fmtByteRate);
          row.cells[4].textContent = p.clientVersion || '';
          row.cells[5].textContent = p.connectedSince || '';
        }, 'No producers', 6);

      const cons = subs.flatMap(({ name, sub }) =>
        (sub.consumers || []).map((c, i) => ({ key: name + '/' + (c.consumerName || '') + '#' + i, name, c })));
      syncRows(consumers, cons, (x) => x.key,
        () => h('tr', {}, h('td', { class: 'name' }), h('td', {}), h('td', {}), h('td', { class: 'num' }),
          h('td', { class: 'num' }), h('td', { class: 'num' }), h('td', {})),
        (row, { name, c }) => {
          row.cells[0].textContent = c.consumerName || '';
          row.cells[1].textContent = name;
          row.cells[2].textContent = c.address || '';
          setValue(row.cells[3], c.msgRateOut || 0, fmtRate);
          setValue(row.cells[4], c.unackedMessages || 0, fmtCount);
          setValue(row.cells[5], c.availablePermits || 0, fmtCount);
          row.cells[6].textContent = c.clientVersion || '';
        }, 'No consumers', 7);
    }

    // The topic's series (a partitioned topic's: its partitions' added up, by sample time).
    async function drawHistory() {
      const names = partitioned
        ? Array.from({ length: Math.min(partitions, MAX_CHART_PARTITIONS) }, (_, i) => t.full + '-partition-' + i)
        : [t.full];
      const views = await Promise.all(names.map((n) =>
        api('GET', '/console/api/history?topic=' + enc(n)).catch(() => ({ points: [] }))));
      const byTime = new Map();
      for (const view of views) {
        for (const p of view.points || []) {
          const sum = byTime.get(p.timeMs) || { timeMs: p.timeMs };
          for (const [k, v] of Object.entries(p)) if (k !== 'timeMs') sum[k] = (sum[k] || 0) + v;
          byTime.set(p.timeMs, sum);
        }
      }
      const points = Array.from(byTime.values()).sort((a, b) => a.timeMs - b.timeMs);
      for (const c of charts) c.draw(points);
    }

    return { el, refresh };
  }

  function notFoundView(hash) {
    return { el: h('div', {}, h('h1', {}, 'Not found'), h('p', {}, 'Nothing here: ' + hash)), refresh: async () => {} };
  }

  // ------------------------------------------------------------------------ tenant tree

  const openTenants = new Set();

  async function loadTree() {
    const tenants = (await api('GET', '/admin/v2/tenants')) || [];
    const tree = $('tree');
    tree.replaceChildren(...tenants.sort().map((tenant) => {
      const list = h('ul', { class: 'namespaces' });
      const item = h('li', { dataset: { tenant } },
        h('button', { type: 'button', onclick: () => toggle(tenant, item, list) }, tenant), list);
      if (openTenants.has(tenant)) expand(tenant, item, list);
      return item;
    }));
    markCurrent();
  }

  function toggle(tenant, item, list) {
    if (openTenants.has(tenant)) {
      openTenants.delete(tenant);
      item.classList.remove('open');
      list.replaceChildren();
    } else {
      openTenants.add(tenant);
      expand(tenant, item, list);
    }
  }

  async function expand(tenant, item, list) {
    item.classList.add('open');
    try {
      const namespaces = (await api('GET', '/admin/v2/namespaces/' + enc(tenant))) || [];
      list.replaceChildren(...namespaces.sort().map((full) => {
        const namespace = full.split('/').slice(1).join('/');
        return h('li', {}, h('a', { href: namespaceHash(tenant, namespace), dataset: { namespace: full } }, namespace));
      }));
      markCurrent();
    } catch (e) {
      if (e.status !== 401) list.replaceChildren(h('li', { class: 'error' }, e.message));
    }
  }

  function markCurrent() {
    for (const a of document.querySelectorAll('.sidebar a')) {
      a.classList.toggle('current', a.getAttribute('href') === (location.hash || '#/'));
    }
  }

  // ------------------------------------------------------------------------ routing and refresh

  let current = null;
  let generation = 0;
  let timer = null;

  function viewFor(hash) {
    const parts = hash.replace(/^#\/?/, '').split('/').map((p) => decodeURIComponent(p));
    if (parts[0] === '' && parts.length === 1) return overviewView();
    if (parts[0] === 'storage' && parts.length === 1) return storageView();
    if (parts[0] === 'ns' && parts.length === 3) return namespaceView(parts[1], parts[2]);
    if (parts[0] === 'topic' && parts.length >= 5) {
      const t = parseTopic(parts[1] + '://' + parts[2] + '/' + parts[3] + '/' + parts.slice(4).join('/'));
      if (t) return topicView(t);
    }
    return notFoundView(hash);
  }

  function route() {
    let view;
    try {
      view = viewFor(location.hash || '#/');
    } catch (_) {
      view = notFoundView(location.hash);
    }
    current = view;
    $('main').replaceChildren(view.el);
    const parts = (location.hash || '').split('/');
    if ((parts[1] === 'ns' || parts[1] === 'topic') && parts.length > 2) {
      const tenant = decodeURIComponent(parts[1] === 'ns' ? parts[2] : parts[3]);
      if (!openTenants.has(tenant)) {
        const item = document.querySelector('#tree li[data-tenant="' + CSS.escape(tenant) + '"]');
        if (item) toggle(tenant, item, item.querySelector('ul'));
      }
    }
    markCurrent();
    refreshSoon();
  }

  // Refreshes the current view now, then every REFRESH_MS (one refresh at a time).
  function refreshSoon() {
    generation += 1;
    clearTimeout(timer);
    tick(generation);
  }

  async function tick(mine) {
    if (mine !== generation || !current || $('app').hidden) return;
    const view = current;
    try {
      await view.refresh();
      $('refresh-state').textContent = 'updated ' + fmtTime(Date.now());
    } catch (e) {
      if (e.status === 401) return;
      $('refresh-state').textContent = 'refresh failed';
      if (mine === generation) notify(e.message || String(e), true);
    }
    if (mine === generation) timer = setTimeout(() => tick(mine), REFRESH_MS);
  }

  // ------------------------------------------------------------------------ login

  function showLogin(message) {
    generation += 1;
    clearTimeout(timer);
    $('app').hidden = true;
    $('banner').hidden = true;
    if ($('dialog').open) $('dialog').close();
    $('main').replaceChildren();
    $('tree').replaceChildren();
    $('cluster-name').textContent = '';
    $('refresh-state').textContent = '';
    $('login-message').textContent = message;
    $('login').hidden = false;
    $('login-token').focus();
  }

  async function start() {
    $('sign-out').hidden = !token();
    try {
      // Whether this token (or none) is let in: a 401 shows the login instead.
      const clusters = await api('GET', '/admin/v2/clusters');
      $('cluster-name').textContent = (clusters || []).join(', ');
    } catch (e) {
      if (e.status === 401) return;
      notify(e.message, true);
    }
    $('login').hidden = true;
    $('app').hidden = false;
    try {
      await loadTree();
    } catch (e) {
      if (e.status === 401) return;
      notify(e.message, true);
    }
    route();
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('login-form').addEventListener('submit', (event) => {
      event.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $('login-token').value.trim());
      $('login-token').value = '';
      start();
    });
    $('sign-out').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      location.reload();
    });
    window.addEventListener('hashchange', () => {
      if (!$('app').hidden) route();
    });
    start();
  });
})();
