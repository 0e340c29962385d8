// The status page's only script: refresh what is shown every 5 s while the page is visible
// (nothing runs while no one looks), and on a listener that needs the admin token, ask for it
// once and keep it in this page's memory only (never stored): links inside the page are
// followed with it, in place.
(() => {
  let token = null;
  const headers = () => (token ? { Authorization: 'Bearer ' + token } : {});
  async function show(path, push) {
    let answer;
    try {
      answer = await fetch(path, { headers: headers(), cache: 'no-store' });
    } catch (e) {
      document.getElementById('live').textContent = 'cannot reach the daemon; trying again';
      return;
    }
    if (answer.status === 401) {
      // No token yet, or the one typed was refused (mistyped, or the daemon's token changed).
      if (token) document.getElementById('live').textContent = 'the token was refused; type it again';
      token = null;
      document.getElementById('login').hidden = false;
      return;
    }
    const page = new DOMParser().parseFromString(await answer.text(), 'text/html');
    const fresh = page.getElementById('main');
    if (!fresh) return;
    document.getElementById('main').replaceWith(fresh);
    document.title = page.title;
    document.getElementById('live').textContent = 'refreshes every 5 s while shown';
    if (push) history.pushState(null, '', path);
  }
  document.addEventListener('submit', (e) => {
    if (e.target.id !== 'login') return;
    e.preventDefault();
    token = e.target.elements.token.value;
    e.target.elements.token.value = '';
    e.target.hidden = true;
    show(location.pathname, false);
  });
  document.addEventListener('click', (e) => {
    const a = e.target.closest('a');
    if (!token || !a || a.origin !== location.origin) return;
    e.preventDefault();
    show(a.pathname, true);
  });
  window.addEventListener('popstate', () => show(location.pathname, false));
  setInterval(() => { if (!document.hidden) show(location.pathname, false); }, 5000);
  document.addEventListener('visibilitychange', () => { if (!document.hidden) show(location.pathname, false); });
})();
