"""The documentation site (docs/conf.py): built once per pytest run with ``sphinx-build -W -n
--keep-going``, offline, and checked: no warning, every public name of the core and every flag of
every script has an entry, every page is reachable from the index, the pages' inline code links to
the API entries, and a real browser (headless Chromium, driven over the DevTools protocol) loads
the index, an API page and the search page, finds ``cast_block`` by searching and sees no broken
image.  Its screenshots go to ``build/docs-screenshots/`` (printed)."""
import base64
import contextlib
import functools
import html.parser
import http.server
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "docs", "_ext"))
sphinx = pytest.importorskip("sphinx", reason="Sphinx is not installed: pip install -e \".[test]\"")
pytest.importorskip("myst_parser", reason="myst-parser is not installed: pip install -e \".[test]\"")
import mxfp16_docs  # noqa: E402  (docs/_ext, the site's own directives)

SCREENSHOTS = os.path.join(ROOT, "build", "docs-screenshots")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.slow  # the build: 20-60 s once per run, shared by these tests


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """``(html folder, exit code, warnings)`` of one build of the site (its CPU seconds printed)."""
    out = tmp_path_factory.mktemp("site")
    html_dir = out / "html"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-n", "--keep-going", "-q", "-b", "html",
         "-d", str(out / "doctrees"), os.path.join(ROOT, "docs"), str(html_dir)],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=600)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"site build: {after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime:.1f} "
          "CPU seconds")
    return str(html_dir), done.returncode, done.stderr


@pytest.fixture(scope="module")
def entries():
    return mxfp16_docs.canonical_entries()


def test_the_site_builds_without_a_warning(site):
    _, code, warnings = site
    assert (code, warnings) == (0, ""), warnings


def _inventory(html_dir):
    from sphinx.util.inventory import InventoryFile
    with open(os.path.join(html_dir, "objects.inv"), "rb") as file:
        inventory = InventoryFile.load(file, "", os.path.join)
    return {name: entry for kind in inventory if kind.startswith("py:")
            for name, entry in _items(inventory[kind])}


def _items(table):
    return table.items() if hasattr(table, "items") else ((key, table[key]) for key in table)


def test_every_public_name_of_the_core_has_an_entry(site, entries):
    inventory = _inventory(site[0])
    modules = mxfp16_docs.api_modules()
    assert {"mxfp16", "mxfp16.amp", "mxfp16.amp.lists", "mxfp16.models", "mxfp16.scaling",
            "mxfp16.checkpoints", "mxfp16.trainer"} <= set(modules)
    missing = [module for module in modules if module not in inventory]
    for (module, name), full in entries.items():
        owner, _, attribute = full.rpartition(".")
        if full not in inventory:
            missing.append(f"{module}.{name} (entry {full})")
        elif getattr(importlib.import_module(module), name) is not \
                getattr(importlib.import_module(owner), attribute):
            missing.append(f"{module}.{name} is not the object of its entry {full}")
    assert missing == []
    assert len(entries) > 400 and "mxfp16.cast_block" in inventory \
        and "mxfp16.Trainer.backward" in inventory


def test_every_module_of_the_core_is_in_the_reference():
    """api_modules() walks the package: a new core module joins it; here each .py file counts."""
    files = set()
    for folder, _, names in os.walk(os.path.join(ROOT, "mxfp16")):
        for name in names:
            if name.endswith(".py") and name != "__main__.py":
                path = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].replace(os.sep, ".")
                files.add(path[:-len(".__init__")] if path.endswith(".__init__") else path)
    core = {name for name in files if not name.startswith(("mxfp16.train", "mxfp16.report",
                                                           "mxfp16.doctor"))
            or name.startswith("mxfp16.trainer")}
    assert core == set(mxfp16_docs.api_modules())


class _Links(html.parser.HTMLParser):
    """The hrefs of a page and, for each ``<code>``, its text and the href around it."""

    def __init__(self):
        super().__init__()
        self.hrefs, self.codes, self._open = [], [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a":
            self.hrefs.append(attrs.get("href") or "")
        self._open.append((tag, attrs.get("href")))
        if tag == "code":
            link = next((href for name, href in reversed(self._open) if name == "a"), None)
            self.codes.append(["", link])

    def handle_endtag(self, tag):
        while self._open and self._open.pop()[0] != tag:
            pass

    def handle_data(self, data):
        if any(name == "code" for name, _ in self._open) and self.codes:
            self.codes[-1][0] += data


def _parse(html_dir, page):
    links = _Links()
    with open(os.path.join(html_dir, page), encoding="utf-8") as file:
        links.feed(file.read())
    return links


def test_every_page_is_reachable_from_the_index(site):
    html_dir = site[0]
    seen, todo = set(), ["index.html"]
    while todo:
        page = todo.pop()
        if page in seen or not os.path.isfile(os.path.join(html_dir, page)):
            continue
        seen.add(page)
        for href in _parse(html_dir, page).hrefs:
            target = urllib.parse.urldefrag(href)[0]
            if target and "://" not in target and target.endswith(".html"):
                todo.append(os.path.normpath(os.path.join(os.path.dirname(page), target)))
    sources = [os.path.join(folder, os.path.splitext(name)[0] + ".html")
               for folder in ("", "api") for name in os.listdir(os.path.join(ROOT, "docs", folder))
               if name.endswith((".md", ".rst"))]
    assert sorted(set(sources) - seen) == []
    assert {"overflow.html", "clusters.html"} & set(sources) <= seen  # issues 37 and 38's pages


def test_every_flag_of_every_script_has_an_entry(site):
    codes = {text for text, _ in _parse(site[0], "cli.html").codes}
    missing = []
    for program in mxfp16_docs.programs():
        parser = mxfp16_docs.program_parser(program)
        missing += [f"{program} {flag}" for action in parser._actions
                    for flag in action.option_strings if flag not in codes]
    assert missing == []
    assert "--save-minutes" in codes and "python scripts/train_imagenet.py" in codes


def test_the_guide_links_the_names_it_uses_to_their_entries(site, entries):
    """Every inline code span of a guide page that names an API entry is a link to it."""
    html_dir = site[0]
    targets = mxfp16_docs.link_targets(entries)
    unlinked, linked = [], 0
    for name in sorted(os.listdir(os.path.join(ROOT, "docs"))):
        if not name.endswith(".md") or name == "index.md":
            continue
        for text, href in _parse(html_dir, name[:-3] + ".html").codes:
            if text in targets:
                anchor = targets[text] if targets[text] not in mxfp16_docs.api_modules() \
                    else "module-" + targets[text]
                if href and href.endswith(f"#{anchor}"):
                    linked += 1
                else:
                    unlinked.append(f"{name}: {text} -> {href}")
    assert unlinked == []
    assert linked > 100
    gluon = _parse(html_dir, "gluon.html").codes
    assert ["cast_block", "api/mxfp16.html#mxfp16.cast_block"] in gluon


# ---- a real browser -----------------------------------------------------------------------------

class DevTools:
    """A headless Chromium page driven over the DevTools protocol (a websocket of JSON messages)."""

    def __init__(self, websocket_url):
        import websocket
        self.socket = websocket.create_connection(websocket_url, timeout=60, suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.socket.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.socket.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def open(self, url, ready="true", timeout=60):
        """Load ``url`` and wait until the page is loaded and the JS expression ``ready`` holds."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not self.evaluate(f"document.readyState === 'complete' && location.href === "
                                f"{json.dumps(url)} && Boolean({ready})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: not ready ({ready}) after {timeout} s")
            time.sleep(0.2)

    def broken_images(self):
        return self.evaluate("Array.from(document.images).filter(i => !i.complete || "
                             "i.naturalWidth === 0).map(i => i.src)")

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as file:
            file.write(base64.b64decode(data))


@contextlib.contextmanager
def _served(folder):
    handler = functools.partial(_QuietHandler, directory=folder)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def _chromium():
    profile = tempfile.mkdtemp(prefix="mxfp16-chromium-")
    process = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", "--remote-debugging-port=0",
         "--window-size=1280,900", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file, deadline = os.path.join(profile, "DevToolsActivePort"), time.monotonic() + 60
        while not (os.path.exists(port_file) and open(port_file).read().count("\n")):
            assert process.poll() is None and time.monotonic() < deadline, "chromium did not start"
            time.sleep(0.1)
        port = open(port_file).read().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as answer:
            page = next(target for target in json.load(answer) if target["type"] == "page")
        browser = DevTools(page["webSocketDebuggerUrl"])
        browser.call("Page.enable")
        yield browser
        browser.socket.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_a_browser_loads_the_pages_and_the_search_finds_cast_block(site):
    html_dir, code, _ = site
    assert os.path.isfile(os.path.join(html_dir, "index.html")), "the site did not build"
    os.makedirs(SCREENSHOTS, exist_ok=True)
    with _served(html_dir) as base, _chromium() as browser:
        pages = {"index": ("index.html", "document.querySelector('.toctree-wrapper') !== null"),
                 "api-mxfp16": ("api/mxfp16.html",
                                "document.getElementById('mxfp16.cast_block') !== null"),
                 "benchmarks": ("benchmarks.html", "document.images.length > 0"),
                 "search-cast_block": ("search.html?q=cast_block",
                                       "document.querySelectorAll('#search-results li').length > 0")}
        found = {}
        for name, (page, ready) in pages.items():
            browser.open(base + page, ready)
            assert browser.broken_images() == [], page
            browser.screenshot(os.path.join(SCREENSHOTS, f"{name}.png"))
            found[name] = browser.evaluate("Array.from(document.querySelectorAll("
                                           "'#search-results li a')).map(a => a.textContent)")
        assert "mxfp16.cast_block" in " ".join(found["search-cast_block"])
        assert browser.evaluate("document.title").startswith("Search")
    print(f"screenshots: {SCREENSHOTS}")
