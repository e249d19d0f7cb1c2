(function () {
  "use strict";
  var tabs = Array.prototype.slice.call(document.querySelectorAll("[role=tab]"));
  var picker = document.getElementById("scenario");

  function showTab(tab) {
    tabs.forEach(function (t) {
      var on = t === tab;
      t.setAttribute("aria-selected", on ? "true" : "false");
      t.tabIndex = on ? 0 : -1;
      document.getElementById(t.getAttribute("aria-controls")).hidden = !on;
    });
    if (picker && picker.options.length > 1) {
      picker.closest(".picker").hidden = tab.getAttribute("data-per-scenario") !== "1";
    }
  }

  function showScenario(id) {
    Array.prototype.forEach.call(document.querySelectorAll("[data-scn]"), function (el) {
      el.hidden = el.getAttribute("data-scn") !== id;
    });
  }

  tabs.forEach(function (t, i) {
    t.addEventListener("click", function () { showTab(t); });
    t.addEventListener("keydown", function (ev) {
      var step = ev.key === "ArrowRight" ? 1 : ev.key === "ArrowLeft" ? -1 : 0;
      if (step) {
        var next = tabs[(i + step + tabs.length) % tabs.length];
        next.focus();
        showTab(next);
      }
    });
  });

  if (picker) {
    picker.addEventListener("change", function () { showScenario(picker.value); });
    showScenario(picker.value);
  }

  // "show timeline" links on the overview: pick the scenario, open tab 1.
  Array.prototype.forEach.call(document.querySelectorAll("[data-goto]"), function (a) {
    a.addEventListener("click", function (ev) {
      ev.preventDefault();
      if (picker) {
        picker.value = a.getAttribute("data-goto");
        showScenario(picker.value);
      }
      showTab(document.getElementById("tab-health"));
    });
  });

  showTab(tabs[0]);
})();
