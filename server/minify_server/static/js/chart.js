// The job page's chart: node count of the best candidate over time (a step line, left axis) and
// checks run (a thin line, right axis), drawn as SVG. It gains points as events arrive.

const SVG = "http://www.w3.org/2000/svg";
const MARGIN = { top: 24, right: 52, bottom: 30, left: 48 };

function svg(tag, attrs = {}, text) {
  const element = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) element.setAttribute(name, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

/** About `count` round tick values in [min, max]. */
function ticks(max, count, min = 0) {
  if (max <= min) return [min];
  const raw = (max - min) / count;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw) || raw;
  const values = [];
  for (let value = Math.ceil(min / step) * step; value <= max + step * 1e-9; value += step) {
    values.push(Math.round(value * 1000) / 1000);
  }
  return values;
}

function timeLabel(seconds) {
  if (seconds < 60) return `${Math.round(seconds * 10) / 10}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m${String(Math.round(seconds % 60)).padStart(2, "0")}`;
  return `${Math.floor(seconds / 3600)}h${String(Math.floor((seconds % 3600) / 60)).padStart(2, "0")}`;
}

export class NodeChart {
  /** @param {HTMLElement} container */
  constructor(container) {
    this.container = container;
    this.points = []; // {t: elapsed seconds, nodes, checks}
    this.nodesOriginal = null;
    this.frame = 0;
    this.element = svg("svg", { class: "chart", role: "img", "aria-label": "node count over time" });
    container.append(this.element);
    this.resizeObserver = new ResizeObserver(() => this.schedule());
    this.resizeObserver.observe(container);
  }

  clear() {
    this.points = [];
    this.schedule();
  }

  /** Add one observation; consecutive observations that change nothing are dropped, and so is a
   * count of 0 before the first real one (the engine's start, before it knows the program). */
  add(t, nodes, checks) {
    if (nodes === null || nodes === undefined || (nodes === 0 && !this.points.length)) return;
    const last = this.points[this.points.length - 1];
    if (last && last.nodes === nodes && last.checks === checks) return;
    if (last && t < last.t) t = last.t;
    this.points.push({ t, nodes, checks });
    this.schedule();
  }

  setOriginal(nodes) {
    if (nodes !== null && nodes !== undefined && nodes !== this.nodesOriginal) {
      this.nodesOriginal = nodes;
      this.schedule();
    }
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.draw();
    });
  }

  destroy() {
    this.resizeObserver.disconnect();
    if (this.frame) cancelAnimationFrame(this.frame);
  }

  draw() {
    const width = Math.max(280, this.container.clientWidth || 600);
    const height = width < 500 ? 200 : 260;
    const root = this.element;
    root.replaceChildren();
    root.setAttribute("viewBox", `0 0 ${width} ${height}`);
    root.setAttribute("width", width);
    root.setAttribute("height", height);
    root.dataset.points = String(this.points.length);
    const last = this.points[this.points.length - 1];
    root.dataset.nodes = last ? String(last.nodes) : "";

    const plotWidth = width - MARGIN.left - MARGIN.right;
    const plotHeight = height - MARGIN.top - MARGIN.bottom;
    if (!this.points.length) {
      root.append(svg("text", { x: width / 2, y: height / 2, class: "chart-empty", "text-anchor": "middle" },
        "waiting for the first progress event"));
      return;
    }
    // Time runs from the first observation: the engine's start-up (reproducing the original)
    // comes before it and would squeeze the interesting part into a corner.
    const minTime = this.points[0].t;
    const maxTime = Math.max(minTime + 1, last.t);
    const maxNodes = Math.max(1, this.nodesOriginal || 0, ...this.points.map((p) => p.nodes));
    const maxChecks = Math.max(1, ...this.points.map((p) => p.checks || 0));
    const x = (t) => MARGIN.left + ((t - minTime) / (maxTime - minTime)) * plotWidth;
    const yNodes = (n) => MARGIN.top + plotHeight - (n / maxNodes) * plotHeight;
    const yChecks = (c) => MARGIN.top + plotHeight - (c / maxChecks) * plotHeight;

    const grid = svg("g", { class: "chart-grid" });
    for (const value of ticks(maxNodes, 4)) {
      const y = yNodes(value);
      grid.append(svg("line", { x1: MARGIN.left, x2: MARGIN.left + plotWidth, y1: y, y2: y }));
      grid.append(svg("text", { x: MARGIN.left - 6, y: y + 4, "text-anchor": "end", class: "axis-nodes" }, value));
    }
    for (const value of ticks(maxChecks, 4)) {
      grid.append(svg("text", { x: MARGIN.left + plotWidth + 6, y: yChecks(value) + 4, class: "axis-checks" }, value));
    }
    for (const value of ticks(maxTime, width < 500 ? 3 : 6, minTime)) {
      grid.append(svg("text", { x: x(value), y: height - 10, "text-anchor": "middle" }, timeLabel(value)));
    }
    grid.append(svg("text", { x: 4, y: MARGIN.top - 12, class: "axis-nodes axis-title" }, "nodes"));
    grid.append(svg("text", { x: width - 4, y: MARGIN.top - 12, "text-anchor": "end", class: "axis-checks axis-title" }, "checks"));
    root.append(grid);

    // Checks: a plain line. Nodes: a step line (the best candidate holds until a smaller one passes),
    // from the original size: an event that reports a larger count than an earlier one (a candidate
    // under test before the original's size was known) does not draw the count going up.
    const checkPath = this.points.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${yChecks(p.checks || 0).toFixed(1)}`);
    root.append(svg("path", { d: checkPath.join(""), class: "line-checks" }));
    let best = this.nodesOriginal || Infinity;
    const steps = this.points.map((p) => {
      best = Math.min(best, p.nodes);
      return { ...p, nodes: best };
    });
    if (this.nodesOriginal && steps[0].nodes < this.nodesOriginal) steps.unshift({ ...steps[0], nodes: this.nodesOriginal });
    let nodePath = "";
    steps.forEach((p, i) => {
      nodePath += i ? `H${x(p.t).toFixed(1)}V${yNodes(p.nodes).toFixed(1)}` : `M${x(p.t).toFixed(1)},${yNodes(p.nodes).toFixed(1)}`;
    });
    nodePath += `H${x(maxTime).toFixed(1)}`;
    root.append(svg("path", { d: nodePath, class: "line-nodes" }));
    const dots = svg("g", { class: "dots-nodes" });
    steps.forEach((p, i) => {
      if (i === 0 || p.nodes !== steps[i - 1].nodes) {
        const dot = svg("circle", { cx: x(p.t), cy: yNodes(p.nodes), r: 3 });
        dot.append(svg("title", {}, `${p.nodes} nodes at ${timeLabel(p.t)}, ${p.checks} checks`));
        dots.append(dot);
      }
    });
    root.append(dots);
  }
}
