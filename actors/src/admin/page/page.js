// The status page's only script: fetch what is shown again when the daemon says something
// changed (server-sent events from /events), or every 5 s where it cannot say (a listener that
// needs the admin token, which an event stream cannot send; too many pages open), and nothing
// while the page is hidden. On a listener that needs the token, ask for it once and keep it in
// this page's memory only (never stored): links inside the page are followed with it, in place.
(() => {
  let token = null;
  let busy = false;
  let again = false;
  let next = null;
  let events = null;
  let poll = null;
  const live = (text) => { document.getElementById('live').textContent = text; };
  const here = () => location.pathname + location.search;
  const headers = () => (token ? { Authorization: 'Bearer ' + token } : {});
  // Someone typing in the filters keeps what they typed: no refresh under their hands.
  const typing = () => document.activeElement && document.activeElement.closest('form.filters');
  async function show(path, push) {
    // One fetch at a time: a refresh asked for meanwhile is done once after it, and a page
    // followed meanwhile is shown after it (never dropped for a refresh).
    if (busy) {
      if (push) next = path; else again = true;
      return;
    }
    busy = true;
    try {
      let answer;
      try {
        answer = await fetch(path, { headers: headers(), cache: 'no-store' });
      } catch (e) {
        live('cannot reach the daemon; trying again');
        return;
      }
      if (answer.status === 401) {
        // No token yet, or the one typed was refused (mistyped, or the daemon's token changed).
        if (token) live('the token was refused; type it again');
        token = null;
        document.getElementById('login').hidden = false;
        return;
      }
      const page = new DOMParser().parseFromString(await answer.text(), 'text/html');
      const fresh = page.getElementById('main');
      if (!fresh) return;
      if (push) history.pushState(null, '', path);
      if (!push && typing()) return;
      document.getElementById('main').replaceWith(fresh);
      document.title = page.title;
      live(events ? 'live' : 'refreshes every 5 s while shown');
    } finally {
      busy = false;
      if (next) { const path = next; next = null; again = false; show(path, true); }
      else if (again) { again = false; show(here(), false); }
    }
  }
  function polling() {
    if (events) { events.close(); events = null; }
    if (!poll) poll = setInterval(() => { if (!document.hidden) show(here(), false); }, 5000);
    live('refreshes every 5 s while shown');
  }
  function listen() {
    if (token || !window.EventSource) return polling();
    events = new EventSource('/events');
    events.addEventListener('change', () => { if (!document.hidden) show(here(), false); });
    events.addEventListener('open', () => live('live'));
    events.addEventListener('error', () => { if (events && events.readyState === EventSource.CLOSED) polling(); });
  }
  document.addEventListener('submit', (e) => {
    if (e.target.id !== 'login') return;
    e.preventDefault();
    token = e.target.elements.token.value;
    e.target.elements.token.value = '';
    e.target.hidden = true;
    polling();
    show(here(), false);
  });
  document.addEventListener('click', (e) => {
    const a = e.target.closest('a');
    if (!token || !a || a.origin !== location.origin) return;
    e.preventDefault();
    show(a.pathname + a.search, true);
  });
  window.addEventListener('popstate', () => show(here(), false));
  document.addEventListener('visibilitychange', () => { if (!document.hidden) show(here(), false); });
  listen();
})();
