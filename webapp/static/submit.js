// Checks a submit form in the browser before anything is sent; the server checks the same rules again
// and stays the authority. The rules are the kind's schema, rendered as attributes by webapp/ui/forms.py:
// required, min / max and data-exclusive-min, whole numbers for integers (the input's step), a JSON object
// for object fields (data-json-object) and data-after (this number must exceed another field's: an end
// after its start). A field that breaks one shows why under it, where the server puts its messages, and
// nothing is sent.
(function () {
  "use strict";
  const form = document.querySelector("form[data-validate]");
  if (!form) return;
  form.noValidate = true; // these messages, at the field, replace the browser's own bubbles

  function number(text) {
    return text === null || text === undefined || text === "" ? null : Number(text);
  }

  function withUnit(value, unit) {
    return unit ? value + " " + unit : String(value);
  }

  function orderProblem(input, value) {
    const other = form.elements.namedItem(input.dataset.after);
    let bound = null; // the other field's value, or its default when it is left empty
    if (other && other.value !== "") bound = Number(other.value);
    else if (input.dataset.afterDefault !== undefined) bound = Number(input.dataset.afterDefault);
    if (bound === null || isNaN(bound) || value > bound) return null; // a bad start says so itself
    return "Must be after " + input.dataset.afterTitle + " (" + withUnit(bound, input.dataset.afterUnit) + ").";
  }

  function problem(input) {
    const validity = input.validity;
    if (validity.valueMissing) return "This field is required.";
    if (validity.badInput) return "Not a valid number.";
    if (input.type === "number" && input.value !== "") {
      const value = Number(input.value);
      const low = number(input.getAttribute("min"));
      const high = number(input.getAttribute("max"));
      const above = number(input.dataset.exclusiveMin);
      if (above !== null && value <= above) return "Must be more than " + above + ".";
      if ((low !== null && value < low) || (high !== null && value > high)) {
        if (low !== null && high !== null) return "Must be between " + low + " and " + high + ".";
        return low !== null ? "Must be at least " + low + "." : "Must be at most " + high + ".";
      }
      if (validity.stepMismatch) return "Must be a whole number.";
      if (input.dataset.after) return orderProblem(input, value);
    }
    if (input.dataset.jsonObject && input.value.trim() !== "") {
      let parsed;
      try {
        parsed = JSON.parse(input.value);
      } catch (e) {
        return "Not valid JSON: " + e.message + ".";
      }
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
        return "Must be a JSON object ({...}).";
      }
    }
    if (validity.tooLong) return "Longer than " + input.maxLength + " characters.";
    return null;
  }

  function check(input) {
    const box = input.closest(".field");
    if (!box) return true;
    box.querySelectorAll(".error").forEach(function (old) { old.remove(); }); // the server's too: re-judged
    const message = problem(input);
    box.classList.toggle("invalid", !!message);
    input.setAttribute("aria-invalid", message ? "true" : "false");
    if (message) {
      const p = document.createElement("p");
      p.className = "error";
      p.setAttribute("role", "alert");
      p.textContent = message;
      box.appendChild(p);
    }
    return !message;
  }

  function inputs() {
    return Array.prototype.filter.call(form.elements, function (el) {
      return el.closest(".field") && el.type !== "hidden" && el.type !== "file" && el.type !== "submit";
    });
  }

  form.addEventListener("submit", function (event) {
    let first = null;
    inputs().forEach(function (input) {
      if (!check(input) && !first) first = input;
    });
    if (first) {
      event.preventDefault();
      first.focus();
    }
  });

  // A field showing a message is checked again as it changes, and so is a field that comes after it.
  form.addEventListener("input", function (event) {
    const changed = event.target;
    inputs().forEach(function (input) {
      const related = input === changed || input.dataset.after === changed.name;
      if (related && input.closest(".field").classList.contains("invalid")) check(input);
    });
  });
})();
