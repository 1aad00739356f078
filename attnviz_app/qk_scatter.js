// The Dataset page's Q/K map drawn with WebGL (issue #21). attnviz_app/qk_scatter.py sends the points;
// this module draws them all in one gl.POINTS call, so a pan step costs one GPU frame instead of Vega's
// canvas redrawing ~79 000 symbols on the CPU (docs/qk-map.md has the numbers). No library, no build step.
//
// The data (bytes, little-endian): a u32 n, n bytes of JSON (the words, photo names, token labels,
// legend, margin), zeros up to a multiple of 16, then one 16-byte record a point:
//   x f32, y f32, r u8, g u8, b u8, kind u8 (0 query, 1 key), photo u16, token u16.

const RECORD = 16;
const PLOT_PX = 460; // the plot's height, as the Altair chart's
const POINT_PX = 4.5; // a point's side in CSS pixels at the first zoom
const ALPHA = 0.6;
const PICK_PX = 8; // how near (CSS pixels) the pointer must be to a point to show its tooltip
const charts = new WeakMap(); // parentElement → its chart: Streamlit calls this module again on every rerun

const VERTEX = `
attribute vec2 a_xy;
attribute vec3 a_colour;
attribute float a_kind;
uniform vec2 u_scale;   // data → clip space: clip = xy * u_scale + u_offset (the pan and zoom)
uniform vec2 u_offset;
uniform float u_size;
varying vec3 v_colour;
varying float v_kind;
void main() {
  gl_Position = vec4(a_xy * u_scale + u_offset, 0.0, 1.0);
  gl_PointSize = u_size;
  v_colour = a_colour;
  v_kind = a_kind;
}`;

const FRAGMENT = `
precision mediump float;
uniform float u_alpha;
varying vec3 v_colour;
varying float v_kind;
void main() {
  vec2 p = gl_PointCoord * 2.0 - 1.0;  // -1 .. 1 across the point's square
  if (v_kind < 0.5 && dot(p, p) > 1.0) discard;                  // a query: a circle
  if (v_kind > 0.5 && max(abs(p.x), abs(p.y)) > 0.85) discard;   // a key: a square of about its area
  gl_FragColor = vec4(v_colour * u_alpha, u_alpha);              // premultiplied, as the canvas is
}`;

export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  let chart = charts.get(parentElement);
  if (!chart) {
    chart = createChart(parentElement, setTriggerValue);
    charts.set(parentElement, chart);
  }
  chart.show(decode(data));
  return () => {
    chart.destroy();
    charts.delete(parentElement);
  };
}

function decode(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const n = view.getUint32(0, true);
  const head = JSON.parse(new TextDecoder().decode(bytes.subarray(4, 4 + n)));
  const start = Math.ceil((4 + n) / RECORD) * RECORD;
  const records = bytes.slice(start); // a copy starting at offset 0 of its own buffer
  const count = records.byteLength / RECORD;
  const fields = new DataView(records.buffer);
  const xs = new Float32Array(count);
  const ys = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    xs[i] = fields.getFloat32(i * RECORD, true);
    ys[i] = fields.getFloat32(i * RECORD + 4, true);
  }
  return { head, records, fields, count, xs, ys };
}

function element(tag, className, parent, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  if (parent) parent.appendChild(node);
  return node;
}

function compile(gl, type, source) {
  const shader = gl.createShader(type);
  gl.shaderSource(shader, source);
  gl.compileShader(shader);
  if (!gl.getShaderParameter(shader, gl.COMPILE_STATUS)) throw new Error(gl.getShaderInfoLog(shader));
  return shader;
}

function createChart(parent, setTriggerValue) {
  const root = element("div", "qk-scatter", parent);
  const shapes = element("div", "qk-legend qk-shapes", root);
  const body = element("div", "qk-body", root);
  const yTitle = element("div", "qk-ytitle", body);
  const plot = element("div", "qk-plot", body);
  plot.style.height = `${PLOT_PX}px`;
  const canvas = element("canvas", "qk-canvas", plot);
  const tip = element("div", "qk-tip", plot);
  tip.hidden = true;
  const xTitle = element("div", "qk-xtitle", root);
  const colours = element("div", "qk-legend qk-colours", root);

  // preserveDrawingBuffer: the tests read the picture back (toDataURL) after it is drawn.
  const gl = canvas.getContext("webgl", { preserveDrawingBuffer: true, antialias: false, alpha: true });
  if (!gl) {
    // No WebGL in this browser: Python draws the Altair chart instead, and says so.
    setTriggerValue("no_webgl", true);
    return { show(d) { plot.textContent = d.head.words.no_webgl; }, destroy() { root.remove(); } };
  }
  const program = gl.createProgram();
  gl.attachShader(program, compile(gl, gl.VERTEX_SHADER, VERTEX));
  gl.attachShader(program, compile(gl, gl.FRAGMENT_SHADER, FRAGMENT));
  gl.linkProgram(program);
  gl.useProgram(program);
  const where = (name) => gl.getUniformLocation(program, name);
  const u = { scale: where("u_scale"), offset: where("u_offset"), size: where("u_size"), alpha: where("u_alpha") };
  const buffer = gl.createBuffer();
  gl.bindBuffer(gl.ARRAY_BUFFER, buffer);
  const attribute = (name, size, type, normalized, offset) => {
    const at = gl.getAttribLocation(program, name);
    gl.enableVertexAttribArray(at);
    gl.vertexAttribPointer(at, size, type, normalized, RECORD, offset);
  };
  attribute("a_xy", 2, gl.FLOAT, false, 0);
  attribute("a_colour", 3, gl.UNSIGNED_BYTE, true, 8);
  attribute("a_kind", 1, gl.UNSIGNED_BYTE, false, 11);
  gl.enable(gl.BLEND);
  gl.blendFunc(gl.ONE, gl.ONE_MINUS_SRC_ALPHA);

  let shown = null; // the decoded data
  let id = null; // the header's id of the points' places: a rerun with the same places keeps the view
  let home = null; // the first view: {x0, x1, y0, y1} in data units
  let view = null; // what is visible now, the same form
  let index = null; // the grid index for the tooltip
  let frame = 0;
  let frames = 0;

  function draw() {
    frame = 0;
    const width = plot.clientWidth;
    if (!width) return; // not laid out yet: the ResizeObserver asks again
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(width * dpr));
    const h = Math.max(1, Math.round(PLOT_PX * dpr));
    if (canvas.width !== w || canvas.height !== h) {
      canvas.width = w;
      canvas.height = h;
    }
    gl.viewport(0, 0, w, h);
    gl.clearColor(0, 0, 0, 0);
    gl.clear(gl.COLOR_BUFFER_BIT);
    if (!shown || !view) return;
    const sx = 2 / (view.x1 - view.x0);
    const sy = 2 / (view.y1 - view.y0);
    gl.uniform2f(u.scale, sx, sy);
    gl.uniform2f(u.offset, -1 - view.x0 * sx, -1 - view.y0 * sy);
    const zoom = (home.x1 - home.x0) / (view.x1 - view.x0);
    gl.uniform1f(u.size, POINT_PX * dpr * Math.min(2.5, Math.sqrt(Math.max(1, zoom))));
    gl.uniform1f(u.alpha, ALPHA);
    gl.drawArrays(gl.POINTS, 0, shown.count);
    canvas.dataset.frames = String(++frames); // for the tests and bench/qkmap.py: a frame was drawn
  }
  const redraw = () => {
    if (!frame) frame = requestAnimationFrame(draw);
  };

  function legend(head) {
    const words = head.words;
    shapes.replaceChildren();
    for (const [kind, text] of [["query", words.query], ["key", words.key]]) {
      const item = element("span", "qk-item", shapes);
      element("span", `qk-mark qk-${kind}`, item);
      element("span", "", item, text);
    }
    xTitle.textContent = words.axis_1;
    yTitle.textContent = words.axis_2;
    colours.replaceChildren();
    const scale = head.legend;
    element("span", "qk-title", colours, scale.title);
    if (scale.stops) {
      element("span", "qk-number", colours, scale.lo);
      const ramp = element("span", "qk-ramp", colours);
      ramp.style.background = `linear-gradient(to right, ${scale.stops.join(", ")})`;
      element("span", "qk-number", colours, scale.hi);
    }
    for (const [name, colour] of scale.entries || []) {
      const item = element("span", "qk-item", colours);
      element("span", "qk-mark qk-query", item).style.background = colour;
      element("span", "", item, name);
    }
    if (scale.more) element("span", "qk-item", colours, scale.more);
    if (scale.none) {
      const item = element("span", "qk-item", colours);
      element("span", "qk-mark qk-query", item).style.background = scale.none_colour;
      element("span", "", item, scale.none);
    }
  }

  function show(d) {
    legend(d.head);
    shown = d;
    gl.bufferData(gl.ARRAY_BUFFER, d.records, gl.STATIC_DRAW);
    tip.hidden = true;
    if (d.head.id !== id) { // new points (not only new colours): a new first view and index
      id = d.head.id;
      let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
      for (let i = 0; i < d.count; i++) {
        x0 = Math.min(x0, d.xs[i]); x1 = Math.max(x1, d.xs[i]);
        y0 = Math.min(y0, d.ys[i]); y1 = Math.max(y1, d.ys[i]);
      }
      if (!(x1 > x0)) { x0 -= 1; x1 += 1; }
      if (!(y1 > y0)) { y0 -= 1; y1 += 1; }
      const px = d.head.margin * (x1 - x0), py = d.head.margin * (y1 - y0); // no point on the edge
      home = { x0: x0 - px, x1: x1 + px, y0: y0 - py, y1: y1 + py };
      view = { ...home };
      index = gridIndex(d, home);
    }
    redraw();
  }

  // --- Pan (drag, one finger), zoom (wheel, two fingers) ---
  const pointers = new Map(); // pointerId → {x, y} in CSS pixels inside the plot
  let moved = 0;
  const local = (e) => {
    const r = canvas.getBoundingClientRect();
    return { x: e.clientX - r.left, y: e.clientY - r.top };
  };
  const toData = (p) => ({
    x: view.x0 + (p.x / plot.clientWidth) * (view.x1 - view.x0),
    y: view.y1 - (p.y / PLOT_PX) * (view.y1 - view.y0),
  });
  function pan(dx, dy) {
    const kx = (view.x1 - view.x0) / plot.clientWidth, ky = (view.y1 - view.y0) / PLOT_PX;
    view = { x0: view.x0 - dx * kx, x1: view.x1 - dx * kx, y0: view.y0 + dy * ky, y1: view.y1 + dy * ky };
  }
  function zoom(p, factor) {
    const at = toData(p);
    view = {
      x0: at.x - (at.x - view.x0) / factor, x1: at.x + (view.x1 - at.x) / factor,
      y0: at.y - (at.y - view.y0) / factor, y1: at.y + (view.y1 - at.y) / factor,
    };
  }
  const spread = () => {
    const [a, b] = [...pointers.values()];
    return { mid: { x: (a.x + b.x) / 2, y: (a.y + b.y) / 2 }, gap: Math.hypot(a.x - b.x, a.y - b.y) };
  };

  canvas.addEventListener("pointerdown", (e) => {
    if (!view) return;
    canvas.setPointerCapture(e.pointerId);
    pointers.set(e.pointerId, local(e));
    moved = 0;
    tip.hidden = true;
    root.classList.add("qk-dragging");
  });
  canvas.addEventListener("pointermove", (e) => {
    if (!view) return;
    const p = local(e);
    if (!pointers.has(e.pointerId)) return hover(p);
    if (pointers.size === 2) {
      const before = spread();
      pointers.set(e.pointerId, p);
      const after = spread();
      pan(after.mid.x - before.mid.x, after.mid.y - before.mid.y);
      if (before.gap > 0 && after.gap > 0) zoom(after.mid, after.gap / before.gap);
    } else {
      const last = pointers.get(e.pointerId);
      pointers.set(e.pointerId, p);
      pan(p.x - last.x, p.y - last.y);
      moved += Math.abs(p.x - last.x) + Math.abs(p.y - last.y);
    }
    redraw();
  });
  const release = (e) => {
    if (!pointers.delete(e.pointerId)) return;
    if (!pointers.size) root.classList.remove("qk-dragging");
    if (e.type === "pointerup" && moved < 4 && !pointers.size) hover(local(e)); // a tap shows the tooltip
  };
  canvas.addEventListener("pointerup", release);
  canvas.addEventListener("pointercancel", release);
  canvas.addEventListener("pointerleave", (e) => {
    if (e.pointerType === "mouse" && !pointers.size) tip.hidden = true; // a finger leaves on every lift
  });
  canvas.addEventListener("wheel", (e) => {
    if (!view) return;
    e.preventDefault();
    zoom(local(e), Math.exp(-e.deltaY * (e.deltaMode === 1 ? 0.05 : 0.002)));
    tip.hidden = true;
    redraw();
  }, { passive: false });

  // --- The tooltip: the nearest point within PICK_PX, found through the grid index ---
  function hover(p) {
    const found = nearest(p);
    if (found < 0) {
      tip.hidden = true;
      return;
    }
    const { head, fields } = shown;
    const kind = fields.getUint8(found * RECORD + 11);
    const photo = fields.getUint16(found * RECORD + 12, true);
    const token = fields.getUint16(found * RECORD + 14, true);
    tip.replaceChildren();
    for (const [title, value] of [
      [head.words.photo, head.names[photo]],
      [head.words.kind, kind ? head.words.key : head.words.query],
      [head.words.token, head.labels[token]],
    ]) {
      const row = element("div", "qk-tip-row", tip);
      element("span", "qk-tip-title", row, title);
      element("span", "qk-tip-value", row, value);
    }
    tip.hidden = false;
    const width = plot.clientWidth;
    const left = p.x + 14 + tip.offsetWidth > width ? Math.max(0, p.x - 14 - tip.offsetWidth) : p.x + 14;
    const top = p.y + 14 + tip.offsetHeight > PLOT_PX ? Math.max(0, p.y - 14 - tip.offsetHeight) : p.y + 14;
    tip.style.left = `${left}px`;
    tip.style.top = `${top}px`;
  }

  function nearest(p) {
    if (!index) return -1;
    const { xs, ys } = shown;
    const kx = plot.clientWidth / (view.x1 - view.x0), ky = PLOT_PX / (view.y1 - view.y0); // pixels per data unit
    const at = toData(p);
    const rx = PICK_PX / kx, ry = PICK_PX / ky;
    const [c0, r0] = index.cell(at.x - rx, at.y - ry);
    const [c1, r1] = index.cell(at.x + rx, at.y + ry);
    let best = -1, bestD = PICK_PX * PICK_PX;
    for (let r = r0; r <= r1; r++) {
      for (let c = c0; c <= c1; c++) {
        const k = r * index.side + c;
        for (let j = index.start[k]; j < index.start[k + 1]; j++) {
          const i = index.items[j];
          const dx = (xs[i] - at.x) * kx, dy = (ys[i] - at.y) * ky;
          const d = dx * dx + dy * dy;
          if (d < bestD || (d === bestD && i > best)) { best = i; bestD = d; } // the later one is drawn on top
        }
      }
    }
    return best;
  }

  const resize = new ResizeObserver(redraw);
  resize.observe(plot);

  return {
    show,
    destroy() {
      resize.disconnect();
      if (frame) cancelAnimationFrame(frame);
      gl.getExtension("WEBGL_lose_context")?.loseContext();
      root.remove();
    },
  };
}

// A uniform grid over the points' box, ~4 points a cell: point indices sorted by cell (a counting sort).
function gridIndex(d, box) {
  const side = Math.max(1, Math.ceil(Math.sqrt(d.count / 4)));
  const cell = (x, y) => [
    Math.min(side - 1, Math.max(0, Math.floor(((x - box.x0) / (box.x1 - box.x0)) * side))),
    Math.min(side - 1, Math.max(0, Math.floor(((y - box.y0) / (box.y1 - box.y0)) * side))),
  ];
  const of = new Int32Array(d.count);
  const start = new Int32Array(side * side + 1);
  for (let i = 0; i < d.count; i++) {
    const [c, r] = cell(d.xs[i], d.ys[i]);
    of[i] = r * side + c;
    start[of[i] + 1]++;
  }
  for (let k = 0; k < side * side; k++) start[k + 1] += start[k];
  const fill = start.slice(0, side * side);
  const items = new Int32Array(d.count);
  for (let i = 0; i < d.count; i++) items[fill[of[i]]++] = i;
  return { side, cell, start, items };
}
