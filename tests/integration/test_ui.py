"""The playground and the pool view in a real headless Chromium (Debian's `chromium` and
`chromium-driver`, driven by selenium): a streamed answer, a reload mid-answer that resumes
where it was, a worker killed mid-answer, the pool view seeing a new worker, a key asked for
and kept, phone-width layout, and no console errors. Skipped where no browser is installed;
CI sets TOKENSPOOL_REQUIRE_BROWSER=1 so that a missing one fails instead.

With TOKENSPOOL_SCREENSHOTS=<dir>, the screenshots (both pages, desktop and phone widths)
are written there too (docs/ui/ holds the README's).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from contract.media.images import png
from devstack.processes import start_api, start_worker, wait_for_model
from devstack.random_vision import write_pair
from tests.hold import HOLD_TOKENS, NO_END
from tests.integration.conftest import MODEL
from tests.integration.test_reasoning import TEMPLATE as THINKING_TEMPLATE
from tests.integration.test_reasoning import THINKING
from tests.integration.test_recovery import Pool, running_pool
from tests.system import missing

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if not (CHROMIUM and DRIVER):
    if os.environ.get("TOKENSPOOL_REQUIRE_BROWSER") == "1":
        raise RuntimeError("TOKENSPOOL_REQUIRE_BROWSER=1 but chromium / chromedriver are not installed")
    pytest.skip(missing("chromium or chromium-driver"), allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

DESKTOP, PHONE = (1280, 900), (390, 844)


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Iterator[Pool]:
    with running_pool(tmp_path_factory.mktemp("ui"), api_env={"UI": "1"}) as p:
        yield p


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_window_size(*DESKTOP)
    try:
        yield driver
    finally:
        driver.quit()


def until(check: Callable[[], object], timeout: float = 60, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise TimeoutError(f"not seen within {timeout} s: {what}")


def console_errors(driver: webdriver.Chrome) -> list[dict]:
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def open_playground(driver: webdriver.Chrome, base: str) -> None:
    driver.get(base + "/")
    until(lambda: driver.find_elements(By.CSS_SELECTOR, "#model option"), what="the model list")


def ask(driver: webdriver.Chrome, prompt: str, max_tokens: int) -> None:
    field = driver.find_element(By.ID, "max-tokens")
    field.clear()
    field.send_keys(str(max_tokens))
    temperature = driver.find_element(By.ID, "temperature")
    temperature.clear()
    temperature.send_keys("0")
    box = driver.find_element(By.ID, "prompt")
    box.send_keys(prompt)
    box.send_keys(Keys.ENTER)  # the keyboard sends


def answer(driver: webdriver.Chrome) -> str:
    items = driver.find_elements(By.CSS_SELECTOR, "li.assistant .content")
    return items[-1].text if items else ""


def finished(driver: webdriver.Chrome) -> bool:
    return bool(driver.find_elements(By.CSS_SELECTOR, "li.assistant[data-done='true']"))


def pending_id(driver: webdriver.Chrome) -> str:
    raw = driver.execute_script("return sessionStorage.getItem('tokenspool.pending')")
    return json.loads(raw)["id"] if raw else ""


def long_answer_under_way(driver: webdriver.Chrome, base: str, max_tokens: int, seen_chars: int) -> str:
    """Ask the playground for a long story and wait until `seen_chars` of it are shown;
    returns the job id the page keeps for it."""
    open_playground(driver, base)
    ask(driver, "Write a long story about a lighthouse keeper, a storm and a ship.", max_tokens)
    until(lambda: len(answer(driver)) >= seen_chars, what="some text")
    return pending_id(driver)


def replay(base: str, job_id: str) -> str:
    """The job's text as the server recorded it: GET ...?stream=true from the start."""
    text = []
    with httpx.stream(
        "GET", f"{base}/v1/chat/completions/{job_id}", params={"stream": "true"}, timeout=60
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text.append(choice["delta"].get("content") or "")
    return "".join(text)


def test_a_prompt_gets_a_streamed_answer_with_its_timings(pool, browser):
    open_playground(browser, pool.base)
    assert browser.find_element(By.ID, "model").get_attribute("value") == MODEL
    ask(browser, "Say hello to the sea.", 24)
    seen = []  # the answer grows while it streams
    until(lambda: seen.append(answer(browser)) or finished(browser), what="the end of the answer")
    assert answer(browser) and len({s for s in seen if s}) > 1, seen
    note = browser.find_element(By.CSS_SELECTOR, "li.assistant .note").text
    assert "TTFT" in note and "tokens/s" in note and "finish:" in note, note
    assert browser.find_element(By.ID, "send").is_enabled()
    assert console_errors(browser) == []


def test_a_reload_mid_answer_resumes_it_without_a_gap_or_a_repeat(pool, browser):
    job_id = long_answer_under_way(browser, pool.base, max_tokens=160, seen_chars=40)
    assert job_id.startswith("chatcmpl-")
    assert not finished(browser)
    browser.refresh()
    until(lambda: finished(browser), what="the resumed answer's end")
    final = answer(browser)
    assert final == replay(pool.base, job_id)
    assert "resumed after a reload" in browser.find_element(By.CSS_SELECTOR, "li.assistant .note").text
    assert browser.execute_script("return sessionStorage.getItem('tokenspool.pending')") is None
    assert console_errors(browser) == []


def test_a_worker_killed_mid_answer_is_recovered_and_the_text_goes_on(pool, browser):
    pool.ensure(2)
    job_id = long_answer_under_way(browser, pool.base, max_tokens=160, seen_chars=20)
    pool.holder(job_id).signal(signal.SIGKILL)
    until(lambda: finished(browser), timeout=90, what="the answer's end after the kill")
    note = browser.find_element(By.CSS_SELECTOR, "li.assistant .note").text
    assert "recovered" in note, note
    assert "finish:" in note, note
    assert answer(browser) == replay(pool.base, job_id)
    assert console_errors(browser) == []
    pool.ensure(2)


def test_a_reasoning_model_s_thinking_is_a_block_above_the_answer(pool, browser):
    """A worker whose template opens `<think>` (tests/data/thinking-chatml.jinja): the page
    shows the thinking apart, collapsed, and keeps it across a reload."""
    thinker = start_worker(
        pool.logs,
        pool.redis_url,
        name="thinker",
        env={"CHAT_TEMPLATE_FILE": THINKING_TEMPLATE, "MODEL_NAME": THINKING, "SLOTS": "1"},
    )
    try:
        wait_for_model(pool.base, THINKING, procs=(thinker,))
        open_playground(browser, pool.base)
        Select(browser.find_element(By.ID, "model")).select_by_value(THINKING)
        ask(browser, "Is 17 a prime number?", 24)
        until(lambda: finished(browser), what="the answer's end")
        for _ in range(2):  # as streamed, then as the page renders it again after a reload
            block = browser.find_elements(By.CSS_SELECTOR, "li.assistant details.thinking")[-1]
            assert block.is_displayed() and block.get_attribute("open") is None
            thought = block.find_element(By.CSS_SELECTOR, ".reasoning").get_attribute("textContent")
            assert thought and "think>" not in thought and "think>" not in answer(browser)
            browser.refresh()
            until(lambda: browser.find_elements(By.CSS_SELECTOR, "li.assistant"), what="the history")
        assert console_errors(browser) == []
    finally:
        thinker.signal(signal.SIGKILL)


def last_note(driver: webdriver.Chrome) -> str:
    notes = driver.find_elements(By.CSS_SELECTOR, "li.assistant .note")
    return notes[-1].text if notes else ""


def test_an_attached_image_goes_with_the_message_to_a_model_that_reads_images(pool, browser, tmp_path):
    """An image attached from a file is shown with the message and sent as an `image_url`
    part: a model without vision refuses it naming the part; a vision worker (the random
    mmproj beside the default model, tests/integration/test_vision.py) answers it."""
    from tests.integration.test_vision import _has_mtmd

    if not _has_mtmd():
        pytest.skip("llama-cpp-python built without mtmd (LLAVA_BUILD=OFF)")
    picture = tmp_path / "picture.png"
    picture.write_bytes(png(32, 32, seed=5))
    text, mmproj = write_pair(tmp_path / "pair")
    env = {"MODEL_PATH": str(text), "MMPROJ_PATH": str(mmproj), "MODEL_NAME": "vision", "SLOTS": "1"}
    seer = start_worker(pool.logs, pool.redis_url, name="seer", env=env)
    try:
        wait_for_model(pool.base, "vision", procs=(seer,))
        open_playground(browser, pool.base)
        for model, expect in ((MODEL, "does not read images"), ("vision", "finish:")):
            Select(browser.find_element(By.ID, "model")).select_by_value(model)
            browser.find_element(By.ID, "image").send_keys(str(picture))
            until(lambda: browser.find_elements(By.CSS_SELECTOR, "#attachments img"), what="the thumbnail")
            ask(browser, "What is in this picture?", 8)
            until(lambda e=expect: e in last_note(browser), what=f"{expect!r} for {model}")
            user = browser.find_elements(By.CSS_SELECTOR, "li.user")[-1]
            shown = user.find_elements(By.CSS_SELECTOR, ".images img")
            assert len(shown) == 1 and shown[0].get_attribute("src").startswith("data:image/png;base64,")
            assert not browser.find_elements(By.CSS_SELECTOR, "#attachments img")  # sent: cleared
        refusal = browser.find_elements(By.CSS_SELECTOR, "li.assistant .note")[0].text
        assert "messages[0].content[1]" in refusal, refusal
        # the browser logs the refusal's 400 itself; nothing else
        assert [e for e in console_errors(browser) if "status of 400" not in e["message"]] == []
    finally:
        seer.signal(signal.SIGKILL)


def test_json_mode_answers_with_a_json_object(pool, browser):
    open_playground(browser, pool.base)
    browser.find_element(By.ID, "json-mode").click()
    ask(browser, "Describe the sea as a JSON object with a name and a colour.", 200)
    until(lambda: finished(browser), what="the JSON answer")
    text = answer(browser).strip()
    note = browser.find_element(By.CSS_SELECTOR, "li.assistant .note").text
    assert text.startswith("{"), text
    if "finish: stop" in note:  # a whole object (at length it may be cut short)
        assert isinstance(json.loads(text), dict)
    assert console_errors(browser) == []


def never_ending_answers(driver: webdriver.Chrome) -> None:
    """The page's next requests ban the model's end tokens (tests/hold.py): an answer goes on
    until it is stopped, or its max tokens run out, however fast the machine."""
    driver.execute_script(
        """const bias = arguments[0], send = window.fetch;
        window.fetch = (url, init) => {
          if (init && typeof init.body === "string" && String(url).endsWith("/chat/completions")) {
            const body = Object.assign(JSON.parse(init.body), {logit_bias: bias});
            init = Object.assign({}, init, {body: JSON.stringify(body)});
          }
          return send(url, init);
        };""",
        NO_END,
    )


def test_stop_cancels_the_answer(pool, browser):
    open_playground(browser, pool.base)
    never_ending_answers(browser)
    ask(browser, "Write a long story about a lighthouse keeper, a storm and a ship.", HOLD_TOKENS)
    until(lambda: len(answer(browser)) >= 10, what="some text")
    job_id = pending_id(browser)
    browser.find_element(By.ID, "stop").click()
    until(lambda: finished(browser), what="the cancelled answer's end")
    again = httpx.post(f"{pool.base}/v1/chat/completions/{job_id}/cancel", timeout=10).json()
    assert again["status"] == "cancelled"  # stopped by the button, not by its length
    assert console_errors(browser) == []


def test_the_pool_view_shows_a_new_worker_within_seconds(pool, browser):
    pool.ensure(2)
    browser.get(pool.base + "/pool")

    def workers() -> str:  # read in one script: the view redraws itself every 2 s
        first = f"section.model[data-model='{MODEL}'] dd"
        return browser.execute_script(
            f"const d = document.querySelector({first!r}); return d ? d.textContent : ''"
        )

    until(lambda: workers() == "2", what="two workers")
    started = time.monotonic()
    pool.spawn()
    until(lambda: workers() == "3", timeout=30, what="the third worker")
    assert time.monotonic() - started < 15
    text = browser.execute_script("return document.querySelector('main').innerText")
    for label in ("slots in use", "queued", "tokens/s", "recovered: crash", "jobs lost"):
        assert label in text, text
    assert console_errors(browser) == []


def test_the_pool_view_has_a_row_per_worker_and_charts_it_draws_itself(pool, browser):
    pool.ensure(2)
    browser.get(pool.base + "/pool")
    section = f"section.model[data-model='{MODEL}']"

    def rows() -> list[list[str]]:
        return browser.execute_script(
            f"return [...document.querySelectorAll({section + ' table.workers tbody tr'!r})]"
            ".map(r => [...r.cells].map(c => c.textContent))"
        )

    live = [name for name, proc in pool.workers.items() if proc.alive()]  # an earlier test may add one
    until(lambda: sorted(r[0] for r in rows()) == sorted(live), what="a row per worker")
    for name, slots, hits, step in rows():
        assert name in pool.workers and " / " in slots and step.endswith(" ms")
        assert hits == "\u2013" or hits.endswith(" %")  # an en dash: nothing read yet
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8}
    httpx.post(pool.base + "/v1/chat/completions", json=chat, timeout=60)
    charts = f"{section} .charts canvas"

    def drawn() -> list[str]:  # each chart's accessible summary: its series' last reading
        return browser.execute_script(
            f"return [...document.querySelectorAll({charts!r})].map(c => c.getAttribute('aria-label'))"
        )

    until(lambda: len(drawn()) == 3 and "no reading yet" not in drawn()[0], what="the charts' readings")
    labels = drawn()
    assert labels[0].startswith("tokens/s: ") and labels[1].startswith("queued: ")
    assert labels[2].startswith("prefix hit rate")
    pixels = browser.execute_script(  # the tokens/s line is drawn: some pixel is not blank
        f"const c = document.querySelector({charts!r}); const d = c.getContext('2d')"
        ".getImageData(0, 0, c.width, c.height).data; return d.some(v => v !== 0)"
    )
    assert pixels
    assert console_errors(browser) == []


def test_the_page_asks_for_a_key_and_keeps_it_for_the_tab(pool, browser, tmp_path):
    api, base = start_api(tmp_path, pool.redis_url, env={"UI": "1", "API_KEYS": "sesame"})
    try:
        page = httpx.get(base + "/", timeout=10)  # the page itself needs no key
        assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
        assert httpx.get(base + "/v1/models", timeout=10).status_code == 401
        browser.get(base + "/")
        until(lambda: "API key" in browser.find_element(By.ID, "status").text, what="the key request")
        key = browser.find_element(By.ID, "key")
        key.send_keys("sesame")
        key.send_keys(Keys.ENTER)
        until(lambda: browser.find_elements(By.CSS_SELECTOR, "#model option"), what="models with the key")
        browser.refresh()  # kept in sessionStorage
        until(lambda: browser.find_elements(By.CSS_SELECTOR, "#model option"), what="models after a reload")
        # 401s before the key is given are the expected console entries; nothing else
        assert [e for e in console_errors(browser) if "401" not in e["message"]] == []
    finally:
        api.stop()


def test_both_pages_fit_a_phone_and_are_kept_as_screenshots(pool, browser, tmp_path):
    out = Path(os.environ.get("TOKENSPOOL_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    for size, width in ((PHONE, "phone"), (DESKTOP, "desktop")):
        browser.set_window_size(*size)
        open_playground(browser, pool.base)
        browser.find_element(By.ID, "clear").click()
        ask(browser, "Say hello to the sea.", 24)
        until(lambda: finished(browser), what="an answer")
        overflow = "return document.documentElement.scrollWidth <= window.innerWidth"
        assert browser.execute_script(overflow), f"the playground scrolls sideways at {size}"
        browser.save_screenshot(str(out / f"playground-{width}.png"))
        browser.get(pool.base + "/pool")
        until(
            lambda: browser.execute_script("return !!document.querySelector('section.model dd')"),
            what="the pool",
        )
        time.sleep(2.5)  # a second read: tokens/s
        assert browser.execute_script(overflow), f"the pool view scrolls sideways at {size}"
        browser.save_screenshot(str(out / f"pool-{width}.png"))
    assert all(
        (out / f"{p}-{w}.png").stat().st_size > 5000
        for p in ("playground", "pool")
        for w in ("phone", "desktop")
    )
    assert console_errors(browser) == []
