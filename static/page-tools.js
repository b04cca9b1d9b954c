// Small page tools, in a static file because the Content-Security-Policy forbids inline script:
// copy buttons (<button data-copy="ID"> copies the text of the element with that id and says so), and
// the nav bar's toggle on narrow screens (<button data-toggles="ID"> opens and closes that element).
(function () {
  "use strict";
  function copied(button, ok) {
    var label = button.getAttribute("data-label") || button.textContent;
    button.setAttribute("data-label", label);
    button.textContent = ok ? "Copied" : "Select and copy it";
    setTimeout(function () { button.textContent = label; }, 2000);
  }
  function selectText(el) {
    var range = document.createRange();
    range.selectNodeContents(el);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  document.addEventListener("click", function (event) {
    var toggle = event.target.closest ? event.target.closest("[data-toggles]") : null;
    if (toggle) {
      var target = document.getElementById(toggle.getAttribute("data-toggles"));
      if (target) {
        var open = target.classList.toggle("open");
        toggle.setAttribute("aria-expanded", open ? "true" : "false");
      }
      return;
    }
    var button = event.target.closest ? event.target.closest("[data-copy]") : null;
    if (!button) return;
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.textContent.trim();
    selectText(source);
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { copied(button, true); },
                                               function () { copied(button, document.execCommand("copy")); });
    } else {
      copied(button, document.execCommand("copy"));  // plain http: the selection is copied instead
    }
  });
})();
