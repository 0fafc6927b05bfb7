// reroll view: sortable tables, the rollout filter, hiding replayed turns (no dependencies).
(function () {
  "use strict";
  function cellKey(row, column, numeric) {
    var cell = row.cells[column];
    var value = cell.getAttribute("data-value");
    if (value === null) { value = cell.textContent.trim(); }
    if (!numeric) { return value.toLowerCase(); }
    var number = parseFloat(value);
    return isNaN(number) ? -Infinity : number;
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var headers = table.querySelectorAll("thead th");
    headers.forEach(function (header, column) {
      header.addEventListener("click", function () {
        var direction = header.getAttribute("data-dir") === "asc" ? "desc" : "asc";
        headers.forEach(function (other) { other.removeAttribute("data-dir"); });
        header.setAttribute("data-dir", direction);
        var numeric = header.getAttribute("data-type") === "number";
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = cellKey(a, column, numeric), y = cellKey(b, column, numeric);
          var order = x < y ? -1 : x > y ? 1 : 0;
          return direction === "asc" ? order : -order;
        });
        rows.forEach(function (row) { body.appendChild(row); });
      });
    });
  });
  var filter = document.getElementById("filter");
  var status = document.getElementById("status-filter");
  function applyFilter() {
    var query = filter.value.toLowerCase();
    var wanted = status.value;
    var shown = 0;
    document.querySelectorAll("#rollouts tbody tr").forEach(function (row) {
      var keep = row.textContent.toLowerCase().indexOf(query) >= 0 &&
        (!wanted || row.getAttribute("data-status") === wanted);
      row.hidden = !keep;
      if (keep) { shown += 1; }
    });
    document.getElementById("shown").textContent = String(shown);
  }
  if (filter && status) {
    filter.addEventListener("input", applyFilter);
    status.addEventListener("change", applyFilter);
  }
  var hide = document.getElementById("hide-replayed");
  if (hide) {
    hide.addEventListener("change", function () { document.body.classList.toggle("hide-replayed", hide.checked); });
  }
})();
