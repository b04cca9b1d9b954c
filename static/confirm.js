// Confirmation before a destructive or wide action: a form, or the button that submits it, carries
// data-confirm="question"; the browser's own confirm() asks it (no inline script: the CSP forbids it).
// data-confirm-count="name" puts how many checkboxes of that name are ticked into the question
// ("the selected" becomes "the 3 selected"), and refuses at once when none is.
(function () {
  "use strict";
  function question(form, submitter) {
    var source = submitter && submitter.hasAttribute("data-confirm") ? submitter : form;
    var text = source.getAttribute("data-confirm");
    if (text === null) return null;
    var countOf = source.getAttribute("data-confirm-count");
    if (countOf) {
      var ticked = form.querySelectorAll('input[type=checkbox][name="' + countOf + '"]:checked').length;
      if (!ticked) return {refuse: "Select some first."};
      text = text.replace("the selected", "the " + ticked + " selected");
    }
    return {ask: text};
  }
  // Capture phase, on the document: runs before htmx's own submit handler on the form.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!(form instanceof HTMLFormElement)) return;
    var q = question(form, event.submitter);
    if (q === null) return;
    var go = q.refuse ? (window.alert(q.refuse), false) : window.confirm(q.ask);
    if (!go) {
      event.preventDefault();
      event.stopImmediatePropagation();
    }
  }, true);
})();
