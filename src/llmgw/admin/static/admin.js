// The admin page's only script: follow mode for a log, and progress bars that move.
// Everything else works without it.  Text from nodes is set with textContent, never as HTML.
"use strict";
(function () {
  var FOLLOW_MS = 5000, PROGRESS_MS = 2000;

  function getJSON(url, done) {
    var xhr = new XMLHttpRequest();
    xhr.open("GET", url);
    xhr.responseType = "json";
    xhr.onload = function () { done(xhr.status === 200 ? xhr.response : null, xhr); };
    xhr.onerror = function () { done(null, xhr); };
    xhr.send();
  }

  var log = document.querySelector("pre[data-follow]");
  var state = document.querySelector("[data-follow-state]");
  if (log) {
    var follow = function () {
      getJSON(log.getAttribute("data-follow"), function (answer, xhr) {
        var now = new Date().toLocaleTimeString();
        if (answer && answer.lines) {
          log.textContent = answer.lines.length ? answer.lines.join("\n") : "(no lines)";
          if (state) state.textContent = "following; last refreshed " + now;
        } else if (state) {
          state.textContent = "could not refresh at " + now + " (" + (xhr.status || "no answer") + "); trying again";
        }
        window.setTimeout(follow, FOLLOW_MS);
      });
    };
    if (state) state.textContent = "following; refreshes every 5 s";
    window.setTimeout(follow, FOLLOW_MS);
  }

  var bars = document.querySelectorAll("progress[data-progress]");
  if (bars.length) {
    var base = document.querySelector("a.brand").getAttribute("href").replace(/\/$/, "");
    var progress = function () {
      getJSON(base + "/progress.json", function (answer) {
        if (!answer || !answer.bars) { window.setTimeout(progress, PROGRESS_MS); return; }
        for (var i = 0; i < bars.length; i++) {
          var key = bars[i].getAttribute("data-progress"), bar = answer.bars[key];
          if (!bar) { window.location.reload(); return; }  // it finished: the page has news
          if (bar.total) { bars[i].max = bar.total; bars[i].value = bar.done; }
          var words = document.querySelector('[data-progress-words="' + CSS.escape(key) + '"]');
          if (words) words.textContent = bar.words;
        }
        window.setTimeout(progress, PROGRESS_MS);
      });
    };
    window.setTimeout(progress, PROGRESS_MS);
  }
})();
