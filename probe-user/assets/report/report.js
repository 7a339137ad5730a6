// memscope-bpf report: draws the data embedded in #report-data with ECharts (inlined above).
// Runs offline; everything it needs is in this file. At the end it writes a self-check
// (#selfcheck: charts drawn, figures shown, errors seen) that the tests read.
(function () {
  'use strict';
  var errors = [];
  window.addEventListener('error', function (e) { errors.push(String(e.message || e)); });
  var origError = console.error;
  console.error = function () { errors.push(Array.prototype.join.call(arguments, ' ')); origError.apply(console, arguments); };

  var t0 = performance.now();
  var D = JSON.parse(document.getElementById('report-data').textContent);
  var charts = [];
  var root = document.getElementById('report');

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    if (attrs) for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  // The one rule for text of the run that goes into markup (ECharts tooltips are HTML); all
  // else is set with textContent. Names come from dumps and traced programs: never trusted.
  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' }[c];
    });
  }
  function fmtBytes(b) {
    var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0, v = b;
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(2) : String(v)) + ' ' + u[i];
  }
  function card(parent, value, label, check) {
    var c = el('div', { 'class': 'card' });
    var b = el('b', check || {}, value);
    c.appendChild(b); c.appendChild(el('span', null, label));
    parent.appendChild(c);
    return b;
  }
  // Every tile that shows bytes goes through here: KiB/MiB/GiB to read, the exact count on
  // hover (title) and in data-bytes (what the tests read).
  function bytesCard(parent, bytes, label, check) {
    var b = card(parent, fmtBytes(bytes), label, check);
    b.setAttribute('title', bytes + ' bytes');
    b.setAttribute('data-bytes', String(bytes));
    b.setAttribute('class', 'bytes');
    return b;
  }
  function chart(parent, cls, option, id) {
    var div = el('div', { 'class': 'chart ' + (cls || ''), id: id });
    parent.appendChild(div);
    var c = echarts.init(div, null, { renderer: 'canvas' });
    option.animation = false;
    c.setOption(option);
    charts.push({ id: id, chart: c, points: option._points || 0 });
    return c;
  }
  function table(parent, head, rows) {
    var t = el('table'), tr = el('tr');
    head.forEach(function (h) { tr.appendChild(el('th', null, h)); });
    t.appendChild(tr);
    rows.forEach(function (r) {
      var tr = el('tr');
      r.forEach(function (c) {
        var td;
        if (c && c.stack !== undefined) {
          td = el('td');
          if (c.stack) {
            var d = el('details'); d.appendChild(el('summary', null, c.site));
            d.appendChild(el('pre', { 'class': 'stack' }, c.stack)); td.appendChild(d);
          } else td.textContent = c.site;
        } else if (typeof c === 'number') { td = el('td', { 'class': 'n' }, String(c)); }
        else td = el('td', null, c);
        tr.appendChild(td);
      });
      t.appendChild(tr);
    });
    parent.appendChild(t);
    return t;
  }
  var palette = ['#5470c6', '#91cc75', '#fac858', '#ee6666', '#73c0de', '#3ba272', '#fc8452', '#9a60b4', '#ea7ccc'];

  function memoryChart(parent, tr, id) {
    var series = [];
    tr.owners.forEach(function (o, i) {
      var data = tr.t.map(function (t, j) { return [t, tr.by_owner[i][j]]; });
      series.push(o.driver ? {
        name: o.name, type: 'line', step: 'end', stack: 'driver', areaStyle: { opacity: 0.75 }, symbol: 'none',
        lineStyle: { width: 0.5 }, data: data, large: true
      } : {
        name: o.name + ' (pool, inside driver memory)', type: 'line', step: 'end', symbol: 'none',
        lineStyle: { width: 1.5, type: 'dashed' }, data: data
      });
    });
    var marks = { silent: true, symbol: 'none', label: { formatter: 'step {b}', fontSize: 10 }, lineStyle: { color: '#888', type: 'dotted' },
      data: tr.steps.map(function (s, i) { return { name: String(i + 1), xAxis: s }; }) };
    var first = series.find(function (s) { return s.stack; }) || series[0];
    if (first) {
      first.markLine = marks;
      first.markPoint = { symbolSize: 44, data: [{ name: 'peak', coord: [tr.peak_t, tr.peak], value: fmtBytes(tr.peak),
        itemStyle: { color: '#d9363e' }, label: { fontSize: 9 } }] };
    }
    return chart(parent, '', {
      _points: tr.t.length,
      color: palette,
      title: { text: 'memory over time, stacked by owner', textStyle: { fontSize: 13 } },
      tooltip: { trigger: 'axis', valueFormatter: function (v) { return fmtBytes(v); } },
      legend: { top: 22, type: 'scroll' },
      grid: { left: 70, right: 30, top: 60, bottom: 60 },
      xAxis: { type: 'value', name: 's', min: 0, max: D.span_s },
      yAxis: { type: 'value', axisLabel: { formatter: fmtBytes } },
      dataZoom: [{ type: 'inside' }, { type: 'slider', height: 18, bottom: 8 }],
      series: series
    }, id);
  }

  function flameData(tree) {
    var out = [];
    function walk(n, depth, start) {
      out.push({ name: n.n, value: [depth, start, start + n.v, n.n, n.v] });
      var s = start;
      (n.c || []).forEach(function (c) { walk(c, depth + 1, s); s += c.v; });
    }
    walk(tree, 0, 0);
    return out;
  }
  function flameChart(parent, tree, title, id) {
    var data = flameData(tree);
    var depth = data.reduce(function (m, d) { return Math.max(m, d.value[0]); }, 0);
    return chart(parent, 'flame', {
      _points: data.length,
      title: { text: title, textStyle: { fontSize: 13 } },
      tooltip: { formatter: function (p) { return esc(p.value[3]) + '<br>' + fmtBytes(p.value[4]) + ' (' + (100 * p.value[4] / Math.max(1, tree.v)).toFixed(1) + '%)'; } },
      grid: { left: 8, right: 8, top: 28, bottom: 8 },
      xAxis: { show: false, min: 0, max: Math.max(1, tree.v) },
      yAxis: { show: false, inverse: true, min: 0, max: depth + 1 },
      series: [{
        type: 'custom', data: data,
        renderItem: function (params, api) {
          var lvl = api.value(0), a = api.coord([api.value(1), lvl]), b = api.coord([api.value(2), lvl + 1]);
          var w = Math.max(0.5, b[0] - a[0]) , h = b[1] - a[1] - 1;
          var name = api.value(3);
          return {
            type: 'rect', shape: { x: a[0], y: a[1], width: w, height: h },
            style: { fill: palette[(lvl + name.length) % palette.length], stroke: '#fff', lineWidth: 0.5 },
            textContent: { style: { text: w > 40 ? name : '', fontSize: 10, fill: '#111', width: w - 4, overflow: 'truncate' } },
            textConfig: { position: 'insideLeft' }
          };
        },
        encode: { x: [1, 2], y: 0 }
      }]
    }, id);
  }

  function timelineChart(parent, tr, id, key) {
    var box = el('div');
    var c = chart(parent, 'small', {
      _points: tr.timeline.length,
      title: { text: 'local maximum per ' + D.timeline_ms + ' ms (click a bar for the sites)', textStyle: { fontSize: 13 } },
      tooltip: { trigger: 'axis', valueFormatter: function (v) { return fmtBytes(v); } },
      grid: { left: 70, right: 30, top: 36, bottom: 30 },
      xAxis: { type: 'category', name: 's', data: tr.timeline.map(function (m) { return m.start_s.toFixed(1); }) },
      yAxis: { type: 'value', axisLabel: { formatter: fmtBytes } },
      series: [{ type: 'bar', barMaxWidth: 24, data: tr.timeline.map(function (m) { return m.bytes; }), itemStyle: { color: '#5470c6' } }]
    }, id);
    parent.appendChild(box);
    function show(i) {
      var m = tr.timeline[i];
      box.innerHTML = '';
      box.appendChild(el('h3', { 'data-check': 'timeline-pick', 'data-track': key },
        'at ' + m.t_s.toFixed(3) + ' s (interval from ' + m.start_s.toFixed(1) + ' s): ' + fmtBytes(m.bytes)));
      table(box, ['live bytes', 'blocks', 'site'], m.sites.map(function (s) { return [s.bytes, s.blocks, s.site]; }));
    }
    c.on('click', function (p) { show(p.dataIndex); });
    if (tr.timeline.length) {
      var best = 0;
      tr.timeline.forEach(function (m, i) { if (m.bytes > tr.timeline[best].bytes) best = i; });
      show(best);
    }
  }

  // ---- header
  root.appendChild(el('h1', null, 'memscope-bpf memory report'));
  root.appendChild(el('p', { 'class': 'sub' }, D.inputs.join(', ') + ' — ' + D.rows + ' rows, ' + D.span_s.toFixed(3) + ' s'));
  var totals = el('div', { 'class': 'cards' });
  root.appendChild(totals);
  // Leaks as the program means them: tensors that outlived their step (or the run), driver
  // memory no pool owns; what the pools keep cached is shown apart and called no leak.
  card(totals, String(D.tensor_leak_blocks), 'tensors leaked', { 'data-check': 'tensor-leak-blocks' });
  bytesCard(totals, D.tensor_leak_bytes, 'in leaked tensors', { 'data-check': 'tensor-leak-bytes' });
  card(totals, String(D.leak_blocks), 'driver blocks leaked (no pool owns them)', { 'data-check': 'leak-blocks' });
  bytesCard(totals, D.leak_bytes, 'driver memory leaked', { 'data-check': 'leak-bytes' });
  bytesCard(totals, D.cached_bytes, 'cached by framework pools at the end (kept for reuse, not a leak)', { 'data-check': 'cached-bytes' });
  card(totals, String(D.tracks.length), 'process/device curves');

  D.tracks.forEach(function (tr, n) {
    var key = tr.pid + '/' + tr.device;
    var sec = el('section', { 'data-track': key });
    root.appendChild(sec);
    sec.appendChild(el('h2', null, 'pid ' + tr.pid + ', device ' + tr.device));
    var cards = el('div', { 'class': 'cards' });
    sec.appendChild(cards);
    bytesCard(cards, tr.peak, 'peak driver memory at ' + tr.peak_t.toFixed(3) + ' s', { 'data-check': 'peak', 'data-track': key });
    bytesCard(cards, tr.end_bytes, 'driver memory at the end', { 'data-check': 'end-bytes', 'data-track': key });
    card(cards, String(tr.leak_count), 'leaked driver blocks (no pool owns them)', { 'data-check': 'track-leaks', 'data-track': key });
    if (tr.tensor_leaks.length) card(cards, String(tr.tensor_leaks.length), 'leaked tensors', { 'data-check': 'track-tensor-leaks', 'data-track': key });
    card(cards, tr.mallocs + ' / ' + tr.frees, 'driver allocations / frees');
    if (tr.pool_peak) bytesCard(cards, tr.pool_peak, 'pool peak', { 'data-check': 'pool-peak', 'data-track': key });
    memoryChart(sec, tr, 'mem-' + n);
    timelineChart(sec, tr, 'timeline-' + n, key);
    var flames = el('div', { 'class': 'row' });
    sec.appendChild(flames);
    var f1 = el('div'), f2 = el('div');
    flames.appendChild(f1); flames.appendChild(f2);
    flameChart(f1, tr.flame_live, 'live at the peak, by stack (' + fmtBytes(tr.flame_live.v) + ')', 'flame-live-' + n);
    flameChart(f2, tr.flame_total, 'allocated in total, by stack (' + fmtBytes(tr.flame_total.v) + ')', 'flame-total-' + n);

    sec.appendChild(el('h3', null, 'live at the peak (' + tr.peak_live_count + ' blocks; largest ' + tr.peak_live.length + ')'));
    table(sec, ['size', 'owner', 'address', 'allocation id', 'allocated (s)', 'step', 'site / stack'],
      tr.peak_live.map(function (b) { return [b.size, b.owner, b.addr, b.alloc_id, b.t.toFixed(6), b.step, { site: b.site, stack: b.stack }]; }));
    sec.appendChild(el('h3', null, 'top sites at the peak'));
    table(sec, ['live bytes', 'blocks', 'site'], tr.peak_sites.map(function (s) { return [s.bytes, s.blocks, s.site]; }));
    if (tr.tensor_leaks.length) {
      var tb = tr.tensor_leaks.reduce(function (a, t) { return a + t.size; }, 0);
      sec.appendChild(el('h3', null, 'leaked tensors: ' + tr.tensor_leaks.length + ' block(s), ' + fmtBytes(tb)));
      table(sec, ['line / stack', 'step', 'size', 'pool', 'address', 'allocation id', 'why'],
        tr.tensor_leaks.map(function (t) { return [{ site: t.site, stack: t.stack }, t.step, t.size, t.pool, t.addr, t.alloc_id, t.why]; }))
        .setAttribute('data-check', 'tensor-leaks');
    }
    tr.pools.forEach(function (p) {
      var figures = p.reserved === null ? '' : ' (the pool says: allocated ' + p.allocated + ' bytes, reserved ' + p.reserved + ' bytes)';
      sec.appendChild(el('p', { 'class': 'note', 'data-check': 'pool-held', 'data-pool': p.pool, 'data-track': key,
        'data-allocated': String(p.allocated), 'data-reserved': String(p.reserved), 'data-cached': String(p.cached_bytes) },
        p.pool + ' pool at the end: ' + p.segments + ' driver segment(s), ' + fmtBytes(p.segment_bytes) + '; ' +
        fmtBytes(p.live_bytes) + ' in ' + p.live_blocks + ' live block(s); ' + fmtBytes(p.cached_bytes) +
        ' cached for reuse (not a leak)' + figures));
    });
    sec.appendChild(el('h3', null, 'leaked driver memory (no pool owns it): ' + tr.leak_count + ' block(s), ' + fmtBytes(tr.leak_bytes)));
    if (tr.leaks.length) {
      table(sec, ['size', 'owner', 'address', 'allocation id', 'allocated (s)', 'step', 'thread', 'site / stack'],
        tr.leaks.map(function (b) { return [b.size, b.owner, b.addr, b.alloc_id, b.t.toFixed(6), b.step, b.tid, { site: b.site, stack: b.stack }]; }));
    } else sec.appendChild(el('p', { 'class': 'note' }, 'no driver block outside the pools was live at the end'));
  });

  if (D.compare) {
    var C = D.compare;
    var sec = el('section', { id: 'compare' });
    root.appendChild(sec);
    sec.appendChild(el('h2', null, 'compare: ' + C.base + ' → ' + C.other));
    table(sec, ['device', 'peak base', 'peak compare', 'diff', 'leaked bytes base', 'leaked bytes compare'],
      C.devices.map(function (d) { return [d.device, d.peak_base, d.peak_other, d.peak_other - d.peak_base, d.leak_base, d.leak_other]; }));
    var series = [];
    C.devices.forEach(function (d) {
      series.push({ name: 'base device ' + d.device, type: 'line', step: 'end', symbol: 'none', data: d.base });
      series.push({ name: 'compare device ' + d.device, type: 'line', step: 'end', symbol: 'none', lineStyle: { type: 'dashed' }, data: d.other });
    });
    chart(sec, '', {
      _points: series.reduce(function (a, s) { return a + s.data.length; }, 0),
      color: palette, title: { text: 'driver memory, both runs (time from each run\'s start)', textStyle: { fontSize: 13 } },
      tooltip: { trigger: 'axis', valueFormatter: function (v) { return fmtBytes(v); } },
      legend: { top: 22 }, grid: { left: 70, right: 30, top: 60, bottom: 40 },
      xAxis: { type: 'value', name: 's' }, yAxis: { type: 'value', axisLabel: { formatter: fmtBytes } },
      series: series
    }, 'compare-chart');
    if (C.ops.length) {
      sec.appendChild(el('h3', null, 'operators (memory_compare)'));
      table(sec, C.ops[0], C.ops.slice(1));
    }
  }

  // ---- self-check, read by the tests: every chart has data and painted pixels.
  function painted(c) {
    var canvas = c.getDom().querySelector('canvas');
    if (!canvas) return 0;
    var ctx = canvas.getContext('2d');
    var img = ctx.getImageData(0, 0, canvas.width, canvas.height).data, n = 0;
    for (var i = 3; i < img.length; i += 16) if (img[i] > 0) n++;
    return n;
  }
  function check() {
    // first_paint_ms: from navigation start (HTML parsed, ECharts evaluated, every chart
    // drawn); draw_ms: our script alone.
    var out = { charts: [], errors: errors, first_paint_ms: performance.now(), draw_ms: performance.now() - t0 };
    charts.forEach(function (c) {
      c.chart.getZr().refreshImmediately();
      out.charts.push({ id: c.id, points: c.points, painted: painted(c.chart) });
    });
    document.getElementById('selfcheck').textContent = JSON.stringify(out);
    document.body.setAttribute('data-ready', '1');
  }
  requestAnimationFrame(function () { setTimeout(check, 0); });
})();
