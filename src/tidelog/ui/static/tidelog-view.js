// tidelog's web view: draws the throughput and replication-lag charts from /api/series with uPlot, every second.
// The tables refresh through htmx (hx-trigger in the HTML); this file only handles the charts.
(function () {
  "use strict";
  const PERIOD_MS = 1000;
  const charts = {};

  function make(id, label, stroke) {
    const element = document.getElementById(id);
    if (!element) return null;
    const options = {
      title: element.dataset.title,
      width: 480,
      height: 220,
      series: [{}, { label: label, stroke: stroke, width: 2, fill: stroke + "22" }],
      axes: [{}, { size: 60 }],
    };
    return new uPlot(options, [[], []], element);
  }

  async function refresh() {
    try {
      const response = await fetch("/api/series", { cache: "no-store" });
      if (!response.ok) return;
      const data = await response.json();
      charts.throughput.setData([data.t, data.records_per_second]);
      charts.lag.setData([data.t, data.max_lag_records]);
      window.tidelogChartPoints = data.t.length;
    } catch (error) {
      // the broker went away: keep the last picture and try again next period
    }
  }

  function start() {
    charts.throughput = make("chart-throughput", "records/s", "#2563eb");
    charts.lag = make("chart-lag", "lag (records)", "#dc2626");
    window.tidelogCharts = charts;
    if (!charts.throughput || !charts.lag) return;
    refresh();
    setInterval(refresh, PERIOD_MS);
  }

  document.addEventListener("DOMContentLoaded", start);
})();
