window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) {
    if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; }
    else { imgs[i].insertAdjacentText('afterend', '[figure failed to render]'); }
  }
  document.documentElement.setAttribute('data-images-decoded', ok + '/' + imgs.length);
  console.log('traceanalyzer-report: images decoded ' + ok + '/' + imgs.length);
});
