// Clicking a tree node shows its details in the panel beside the tree.
document.addEventListener("click", function (ev) {
  var node = ev.target.closest(".node[data-target]");
  if (!node) { return; }
  var tree = node.closest(".tree-wrap");
  tree.querySelectorAll(".node.sel").forEach(function (n) { n.classList.remove("sel"); });
  tree.querySelectorAll(".node-detail.shown").forEach(function (d) { d.classList.remove("shown"); });
  node.classList.add("sel");
  var detail = document.getElementById(node.getAttribute("data-target"));
  if (detail) { detail.classList.add("shown"); }
  var empty = tree.querySelector(".detail-empty");
  if (empty) { empty.style.display = "none"; }
});
