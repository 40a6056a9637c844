// The report's step slider (visuals/report.py): copies the embedded classes and titles of one step into the
// panels; moves the answer highlight, legend, caption and image. Plain ES2015, no library.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("xai-data").textContent);
  var slider = document.getElementById("xai-step");
  if (!slider || !D.steps) return;
  var mean = document.getElementById("xai-mean"), out = document.getElementById("xai-step-out");
  var view = document.getElementById("xai-view"), img = document.getElementById("xai-image");
  var answer = document.querySelectorAll(".xai-answer .xai-step"), panels = view.querySelectorAll(".xai-panel");
  var CLS = {"0": "", ".": "xg"}, tokens = [], i;
  for (i = 1; i <= 8; i++) { CLS[String(i)] = "r" + i; CLS["abcdefgh"[i - 1]] = "b" + i; }
  for (i = 0; i < panels.length; i++) tokens.push(panels[i].querySelectorAll(".xai-flow i:not(.xh)"));
  function title(v) {
    return v === null ? "no score" : (v < 0 || Object.is(v, -0) ? "-" : "+") + Math.abs(v).toFixed(2);
  }
  function show() {
    var step = Number(slider.value) - 1, v = mean.checked ? D.steps : step, m, j;
    out.textContent = mean.checked ? "mean of " + D.steps : step + 1 + " / " + D.steps;
    view.querySelector(".xai-heatmap > div").textContent = D.captions[v];
    for (m = 0; m < D.z.length; m++) {
      if (!D.z[m]) continue;
      var z = D.z[m][v], bins = D.bins[m][v], els = tokens[m];
      for (j = 0; j < els.length; j++) {
        var c = CLS[bins.charAt(j)];
        if (c) els[j].className = c; else els[j].removeAttribute("class");
        els[j].title = title(z[j]);
      }
    }
    var legend = view.querySelector(".xai-legend");
    if (legend) legend.outerHTML = D.legends[D.legend[v]];
    for (j = 0; j < answer.length; j++) {
      if (j === step && !mean.checked) answer[j].setAttribute("data-selected", "true");
      else answer[j].removeAttribute("data-selected");
    }
    if (img && D.frames.length) {
      var best = D.frames[0];
      for (j = 1; j < D.frames.length; j++) {
        if (Math.abs(D.frames[j][0] - step) < Math.abs(best[0] - step)) best = D.frames[j];
      }
      img.src = best[1];
      document.getElementById("xai-image-caption").textContent = D.frameCaption
        .replace("{shown}", best[0] + 1).replace("{note}", best[0] === step ? "" : D.nearestNote);
    }
  }
  slider.addEventListener("input", show);
  mean.addEventListener("change", show);
  for (i = 0; i < answer.length; i++) {
    answer[i].addEventListener("click", function () {
      slider.value = Number(this.getAttribute("data-step")) + 1;
      mean.checked = false;
      show();
    });
  }
  show();
})();
