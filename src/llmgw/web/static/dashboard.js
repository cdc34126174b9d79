// llmgw dashboard: the little htmx does not do by itself. Served from this origin
// (the Content-Security-Policy allows no inline script).
//
// A refresh replaces a node's card when it changed; the folds a person opened or
// closed on it (its GPU rows, its shards) stay as they were left.
document.addEventListener("htmx:oobBeforeSwap", (event) => {
  const old = event.detail.target;
  const fresh = event.detail.fragment;
  if (!old || !fresh || typeof old.querySelectorAll !== "function") return;
  for (const fold of old.querySelectorAll("details[data-fold]")) {
    const twin = fresh.querySelector(`details[data-fold="${CSS.escape(fold.dataset.fold)}"]`);
    if (twin) twin.open = fold.open;
  }
});
