#!/usr/bin/env python3
"""numesh serve's page for people (GET /, serve/web/index.html), checked over HTTP and in a real
browser: headless Chromium from Debian, driven by Selenium (chromium, chromium-driver,
python3-selenium).

Over HTTP: GET / is 200 text/html with its Content-Security-Policy, whose hashes are those of the
page's inline script and style; it answers while the model loads (when /health says 503) and
without the API key when one is set, while the API calls need it.

In the browser, on a tiny Llama with a chat template (server_check.py's writer and template):
the title and the model's name; Shift+Enter starts a new line and Enter sends; the assistant's
bubble grows as the tokens stream (seen over several polls) and ends with the text the API gives
for the same greedy chat; the load panel updates every second and its KV blocks line is filled;
while a long generation runs the panel shows one running sequence, and Stop cancels it on the
server (/metrics: nothing runs, the count of generated tokens stops short of max_tokens); no
Content-Security-Policy violation in the console. With --api-key: the page asks for the key,
keeps it in sessionStorage and then works. A model without a chat template: the page says so and
sends a completion instead. Each server is stopped by SIGTERM and must exit 0.

A missing chromium, chromedriver or selenium FAILS the check, naming what to install; with
NUMESH_SKIP_BROWSER_CHECKS=1 it instead prints a line starting "web_check: skipped:" (after the
HTTP checks, which need no browser) and exits 0, which the test's SKIP_REGULAR_EXPRESSION makes a
skip, as the tokenizer checks do with NUMESH_SKIP_TOKENIZER_CHECKS.

usage: web_check.py NUMESH WORK_DIR TOKENIZER_JSON
"""

import base64
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# server_check.py reads the same three arguments when imported (and leaves no __pycache__ in the
# source tree).
sys.dont_write_bytecode = True
from server_check import (CHAT_TEMPLATE, FAILURES, NUMESH, WORK, Server,  # noqa: E402
                          check, write_model)

SKIP_MISSING = os.environ.get("NUMESH_SKIP_BROWSER_CHECKS") == "1"
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
KEY = "page-s3cret"
# The web model's positions and the server's context: room for the long generation that Stop ends.
LONG_CONTEXT = 4608


def missing_browser():
    """What of the browser half is not installed (Debian's package names)."""
    missing = [] if CHROMIUM else ["chromium"]
    if not CHROMEDRIVER:
        missing.append("chromium-driver")
    try:
        import selenium.webdriver  # noqa: F401
    except ImportError:
        missing.append("python3-selenium")
    return missing


def get(port, path, headers=None):
    """(status, headers, body) of a GET."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def inline_hash(page, tag):
    """CSP's 'sha256-...' of the page's one inline <tag> element's text."""
    text = page.split(f"<{tag}>", 1)[1].split(f"</{tag}>", 1)[0]
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def check_page_over_http(port, keyed=False):
    """GET /: the page, its headers, its policy's hashes; open without the key."""
    status, headers, page = get(port, "/")
    check(status == 200 and headers.get("Content-Type") == "text/html; charset=utf-8",
          f"GET / is the page: {status} {headers.get('Content-Type')}")
    check("<title>numesh serve</title>" in page, "the page's title")
    policy = headers.get("Content-Security-Policy", "")
    check("default-src 'self'" in policy and "frame-ancestors 'none'" in policy and
          "unsafe" not in policy, f"a restrictive Content-Security-Policy: {policy!r}")
    for tag in ("script", "style"):
        check(f"{tag}-src {inline_hash(page, tag)}" in policy,
              f"the policy allows the page's own {tag} by its hash: {policy!r}")
    check(headers.get("Cache-Control") == "no-cache",
          f"Cache-Control: {headers.get('Cache-Control')}")
    if keyed:
        status, _, _ = get(port, "/v1/models")
        check(status == 401, f"with --api-key the API needs it ({status}) while / does not")
        status, _, _ = get(port, "/metrics", {"Authorization": f"Bearer {KEY}"})
        check(status == 200, f"/metrics with the key: {status}")


class LoadingServer(Server):
    """`numesh serve` on a port chosen here, given back as soon as it answers: while the model
    loads (it binds first). ready() waits for the "listening on" line."""

    def __init__(self, model, *args):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen([NUMESH, "serve", "--model", model, "--port", str(self.port),
                                      "--quiet", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.banner = None
        deadline = time.time() + 60
        while time.time() < deadline and self.proc.poll() is None:
            try:
                self.first_health = get(self.port, "/health")[0]
                return
            except OSError:  # not bound yet
                time.sleep(0.01)
        raise RuntimeError(f"numesh serve did not answer: {self.proc.communicate()}")

    def ready(self):
        self.banner = self.proc.stdout.readline()
        check(f"listening on http://127.0.0.1:{self.port}" in self.banner,
              f"the listening line: {self.banner!r}")


# ---------------------------------------------------------------------------------------------
# The browser half.


class Page:
    """Headless Chromium on one page of a server."""

    def __init__(self, driver):
        self.driver = driver

    def js(self, script, *args):
        return self.driver.execute_script(script, *args)

    def find(self, css):
        from selenium.webdriver.common.by import By
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def text(self, element_id):
        return self.js("return document.getElementById(arguments[0]).textContent", element_id)

    def wait(self, what, condition, timeout=30):
        """Polls condition() until it is true (returned) or the timeout (a failed check)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            value = condition()
            if value:
                return value
            time.sleep(0.05)
        check(False, f"timed out after {timeout} s waiting for {what}")
        return None

    def open(self, port):
        self.driver.get(f"http://127.0.0.1:{port}/")
        check(self.driver.title == "numesh serve", f"the page's title: {self.driver.title!r}")

    def settings(self, max_tokens, temperature):
        if self.find("#settings").get_attribute("open") is None:
            self.find("#settings summary").click()
        for css, value in (("#max-tokens", max_tokens), ("#temperature", temperature)):
            field = self.find(css)
            field.clear()
            field.send_keys(str(value))

    def send(self, message):
        """Types `message` (its newlines with Shift+Enter) and sends it with Enter."""
        from selenium.webdriver.common.keys import Keys
        field = self.find("#input")
        for i, line in enumerate(message.split("\n")):
            if i > 0:
                field.send_keys(Keys.SHIFT, Keys.ENTER)
            field.send_keys(line)
        check(field.get_attribute("value") == message,
              f"Shift+Enter starts a new line: {field.get_attribute('value')!r}")
        field.send_keys(Keys.ENTER)

    def reply(self):
        """The last assistant bubble: [length of its text, deltas, done, text] or None."""
        return self.js("""
            const all = document.querySelectorAll('.msg.assistant .text');
            if (all.length === 0) return null;
            const t = all[all.length - 1];
            return [t.textContent.length, Number(t.dataset.deltas || 0), t.dataset.done === 'true',
                    t.textContent];""")

    def watch_reply(self, bubbles_before, timeout=60, on_poll=None):
        """Polls the new assistant bubble until it is done: (text, deltas, lengths seen)."""
        lengths = []
        deadline = time.time() + timeout
        state = None
        while time.time() < deadline:
            count = self.js("return document.querySelectorAll('.msg.assistant').length")
            state = self.reply() if count > bubbles_before else None
            if state is not None:
                if not lengths or lengths[-1] != state[0]:
                    lengths.append(state[0])
                if on_poll is not None:
                    on_poll(state)
                if state[2]:
                    return state[3], state[1], lengths
            time.sleep(0.02)
        check(False, f"the reply did not end within {timeout} s: {state}")
        return (state[3], state[1], lengths) if state else ("", 0, lengths)

    def bubbles(self, role):
        return self.js("return Array.from(document.querySelectorAll('.msg.' + arguments[0] + "
                       "' .text')).map((e) => e.textContent)", role)


def start_browser(profile):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu",
                     f"--user-data-dir={profile}", "--window-size=1280,900"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def chat_in_browser(page, server):
    """A streamed chat, the load panel, Stop (on the page loading_in_browser opened)."""
    message = "Hello\nthere"
    page.settings(max_tokens=48, temperature=0)
    page.send(message)
    text, deltas, lengths = page.watch_reply(0)
    print(f"web_check: the reply grew through the lengths {lengths} in {deltas} deltas: "
          f"{text[:60]!r}")
    check(len(text) > 0 and deltas >= 2, f"the reply has streamed text: {deltas} deltas, {text!r}")
    check(len([n for n in lengths if n > 0]) >= 2,
          f"the reply was seen growing (streamed), not whole at once: lengths {lengths}")
    status, body, _ = server.request("POST", "/v1/chat/completions",
                                     {"messages": [{"role": "user", "content": message}],
                                      "max_tokens": 48, "temperature": 0})
    want = body["choices"][0]["message"]["content"] if status == 200 else None
    check(text == want, f"the page shows the API's greedy text: {text!r} != {want!r}")
    check(page.bubbles("user") == [message], f"the user's bubble: {page.bubbles('user')}")
    check(page.find("#send").is_enabled() and not page.find("#stop").is_enabled(),
          "Send is back and Stop off once the reply ended")

    # The load panel: updated every second, its numbers filled.
    page.wait("two updates of the load panel",
              lambda: int(page.find("#load").get_attribute("data-updates")) >= 2)
    kv = page.text("kv-blocks")
    check(re.fullmatch(r"\d+ of \d+", kv) is not None and int(kv.split()[-1]) > 0,
          f"the KV blocks line: {kv!r}")
    for element_id in ("generated-rate", "prefill-rate"):
        check(re.fullmatch(r"\d+\.\d", page.text(element_id)) is not None,
              f"{element_id}: {page.text(element_id)!r}")
    check(re.fullmatch(r"\d+ tokens", page.text("prefix-hits")) is not None,
          f"prefix-cache hits: {page.text('prefix-hits')!r}")

    # A long generation in a new conversation: the panel shows it running, Stop cancels it.
    page.find("#new-chat").click()
    check(page.js("return document.querySelectorAll('.msg').length") == 0,
          "a new chat starts empty")
    check(len(page.js("return document.querySelectorAll('#conversations li')")) == 2,
          "the conversation list holds both chats")
    # Long enough to be seen running and stopped whatever the build's speed: a Release build
    # on a fast machine generated 400 tokens between two polls of the panel (one a second).
    max_tokens = 4000
    page.settings(max_tokens=max_tokens, temperature=0)
    page.wait("the panel showing nothing running before", lambda: page.text("running") == "0")
    before = server.metrics()["numesh_generated_tokens_total"]
    page.send("Tell me a long story")
    seen = {"running": set(), "length_at_stop": None}

    def on_poll(state):
        seen["running"].add(page.text("running"))
        if seen["length_at_stop"] is None and "1" in seen["running"] and state[0] > 0:
            seen["length_at_stop"] = state[0]
            page.find("#stop").click()

    text, deltas, _ = page.watch_reply(0, on_poll=on_poll)
    check("1" in seen["running"], f"the load panel showed the sequence running: {seen['running']}")
    check(seen["length_at_stop"] is not None, "Stop was pressed during the generation")
    running = page.wait("nothing running on the server after Stop",
                        lambda: server.metrics()["numesh_requests_running"] == 0 or None, 10)
    first = server.metrics()["numesh_generated_tokens_total"]
    time.sleep(1)
    after = server.metrics()
    check(running and after["numesh_generated_tokens_total"] == first and
          first - before < max_tokens,
          f"Stop cancelled the request on the server: {first - before} of {max_tokens} tokens, "
          f"then {after['numesh_generated_tokens_total'] - first} more")
    check(after["numesh_kv_blocks_used"] == 0, f"its blocks are free: {after}")
    notes = page.bubbles("note")
    check(notes[-1:] == ["stopped"], f"the page says it stopped: {notes}")
    check(page.find("#send").is_enabled(), "Send is back after Stop")
    page.wait("the panel showing nothing running", lambda: page.text("running") == "0")
    print(f"web_check: stopped after {int(first - before)} tokens ({deltas} deltas shown); "
          f"the panel showed running {sorted(seen['running'])}, KV blocks {kv}")


def keyed_in_browser(page, server, model_name):
    """With --api-key: the page asks for it, keeps it for the tab, then works. The model has no
    chat template: the page says so and sends a completion instead."""
    from selenium.webdriver.common.keys import Keys
    page.open(server.port)
    page.wait("the key field", lambda: page.find("#key-form").is_displayed())
    # The key field may show before the status line has the refusal's text: wait for both.
    status = page.wait("the status saying 401", lambda: "401" in page.text("status"), 10)
    check(status, f"the status says 401: {page.text('status')!r}")
    field = page.find("#key")
    field.send_keys(KEY)
    field.send_keys(Keys.ENTER)
    page.wait("the model's name with the key", lambda: page.text("model") == model_name)
    check(page.js("return sessionStorage.getItem('numesh.apiKey')") == KEY,
          "the key is kept in sessionStorage")
    check(not page.find("#key-form").is_displayed(), "the key field is hidden once it works")
    page.wait("the load panel with the key",
              lambda: int(page.find("#load").get_attribute("data-updates")) >= 1)

    page.settings(max_tokens=16, temperature=0)
    page.send("hello")
    text, _, _ = page.watch_reply(0)
    notes = page.bubbles("note")
    check(len(notes) == 1 and "no chat template" in notes[0],
          f"the page says the model has no chat template: {notes}")
    check(page.bubbles("error") == [], f"no error: {page.bubbles('error')}")
    status, body, _ = server.request("POST", "/v1/completions",
                                     {"prompt": "hello", "max_tokens": 16, "temperature": 0},
                                     {"Authorization": f"Bearer {KEY}",
                                      "Content-Type": "application/json"})
    want = body["choices"][0]["text"] if status == 200 else None
    check(text == want, f"the page shows the completion's text: {text!r} != {want!r}")


def console_errors(driver):
    """The console's Content-Security-Policy violations and uncaught errors."""
    return [e["message"] for e in driver.get_log("browser")
            if "Content Security Policy" in e["message"] or "Uncaught" in e["message"]]


def loading_in_browser(page, server, model_name):
    """The page opened while the model loads says so, then shows the model once it is there."""
    page.open(server.port)
    statuses = set()

    def shown():
        status = page.text("status")
        statuses.add(status)
        return status == "ready" and page.text("model") == model_name

    page.wait("the status 'ready' and the model's name", shown, 60)
    loading = "loading the model\u2026" in statuses
    # The page asks /health at once and shows "loading" until its next poll a second later: not
    # seen, the model must have been loaded by the time the page asked.
    check(loading or server.first_health == 200,
          f"the page opened during the load says so: {statuses}")
    print(f"web_check: the page opened while the model loaded: {sorted(statuses)}")


def main():
    shutil.rmtree(WORK, ignore_errors=True)
    missing = missing_browser()
    if missing and not SKIP_MISSING:
        print(f"web_check: FAILED: {', '.join(missing)} not installed. Install Debian's chromium, "
              "chromium-driver and python3-selenium (apt-get install chromium chromium-driver "
              "python3-selenium; scripts/setup.sh does), or set NUMESH_SKIP_BROWSER_CHECKS=1 to "
              "report this check as skipped.", file=sys.stderr)
        return 1
    # A slower model than server_check's (it loads for a second or two, and a long generation
    # can be watched and stopped: a Release build stops it after 150-200 of its 4000 tokens on
    # two Emerald Rapids cores), with the chat template; a tiny one without.
    model = os.path.join(WORK, "web-model")
    write_model(model, hidden=512, layers=8, heads=8, kv_heads=2, ffn=1024,
                chat_template=CHAT_TEMPLATE, positions=LONG_CONTEXT)
    plain = os.path.join(WORK, "plain-model")
    write_model(plain)

    servers = []
    driver = None
    try:
        if not missing:
            driver = start_browser(tempfile.mkdtemp(prefix="chromium-", dir=WORK))
        server = LoadingServer(model, "--parallel", "2", "--ctx-size", str(LONG_CONTEXT))
        servers.append(server)
        # Over HTTP first: while the model loads, when it has not loaded yet.
        if server.first_health == 503:
            check(get(server.port, "/v1/models")[0] == 503, "the API answers 503 while loading")
        check_page_over_http(server.port)
        page = Page(driver) if driver else None
        if page:
            loading_in_browser(page, server, "web-model")
        server.ready()
        keyed = Server(plain, "--api-key", KEY, "--parallel", "1")
        servers.append(keyed)
        check_page_over_http(keyed.port, keyed=True)

        if page:
            chat_in_browser(page, server)
            keyed_in_browser(page, keyed, "plain-model")
            errors = console_errors(driver)
            check(errors == [], f"no policy violation or uncaught error in the console: {errors}")

        while servers:
            code, out, err = servers.pop().stop()
            check(code == 0 and "stopped on signal 15" in out, f"SIGTERM: exit {code}: {out} {err}")
    finally:
        if driver is not None:
            driver.quit()
        for s in servers:
            s.proc.kill()
            s.proc.wait()

    if FAILURES:
        print(f"web_check: {len(FAILURES)} checks failed")
        return 1
    if missing:
        print(f"web_check: skipped: {', '.join(missing)} not installed "
              "(NUMESH_SKIP_BROWSER_CHECKS=1); the HTTP checks of GET / passed")
        return 0
    print("web_check: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
