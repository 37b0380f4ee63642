// Allot's own script: destructive forms ask before they post (see
// views/confirm.templ). A submit button with data-confirm="ID" opens the
// <dialog> ID instead of submitting; the dialog's "yes" button submits the
// form with confirm=yes and its "no" button (data-confirm-close) closes it.
// Without this script, or without <dialog>, the button posts the form
// without confirm=yes and the server answers with the same question as a
// page, so every action still asks first.
document.addEventListener("click", (e) => {
  const ask = e.target.closest("button[data-confirm]");
  if (ask) {
    const d = document.getElementById(ask.dataset.confirm);
    if (d && typeof d.showModal === "function") {
      e.preventDefault();
      d.showModal();
    }
    return;
  }
  const no = e.target.closest("button[data-confirm-close]");
  if (no && no.closest("dialog")) {
    no.closest("dialog").close();
  }
});

// A page that refreshes itself (HTMX) does not replace an open question.
document.addEventListener("htmx:beforeRequest", (e) => {
  const open = document.querySelector("dialog[open]");
  if (open && e.detail.elt.contains(open)) {
    e.preventDefault();
  }
});
