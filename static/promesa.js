// Polling for elements marked data-poll-seconds="N": they receive a "poll" event (hx-trigger="poll")
// every N seconds while the tab is visible. htmx's own trigger filters ("every 5s [cond]") need eval,
// which the Content-Security-Policy forbids.
(function () {
  "use strict";
  function start(el) {
    if (el.promesaPoll) return;
    var seconds = Number(el.getAttribute("data-poll-seconds")) || 5;
    el.promesaPoll = setInterval(function () {
      if (!document.body.contains(el)) { clearInterval(el.promesaPoll); return; }
      if (document.visibilityState === "visible") htmx.trigger(el, "poll");
    }, seconds * 1000);
  }
  function scan(root) {
    if (root.matches && root.matches("[data-poll-seconds]")) start(root);
    if (root.querySelectorAll) root.querySelectorAll("[data-poll-seconds]").forEach(start);
  }
  document.addEventListener("DOMContentLoaded", function () { scan(document); });
  document.addEventListener("htmx:load", function (event) { scan(event.target); });
})();
