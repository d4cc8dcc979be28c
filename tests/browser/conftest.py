"""A real browser (Debian's chromium through chromedriver) for the pages a person uses, with a screenshot of each."""

import os
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Where the screenshots go: SCREENSHOTS_DIR, else .run/screenshots/ in the checkout (ignored by git).
SCREENSHOTS_DIR = Path(
    os.environ.get("SCREENSHOTS_DIR") or Path(__file__).resolve().parents[2] / ".run" / "screenshots"
)
PASSWORD = "browser-test-password"  # noqa: S105


class Browser:
    """A chromium session against one base URL, with the few steps every flow repeats."""

    def __init__(self, driver: webdriver.Chrome, base_url: str):
        self.driver, self.base_url = driver, base_url

    def open(self, path: str) -> None:
        self.driver.get(self.base_url + path)

    def find(self, css: str, timeout: float = 15):
        return WebDriverWait(self.driver, timeout).until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, css))
        )

    def click(self, css: str, timeout: float = 15) -> None:
        WebDriverWait(self.driver, timeout).until(
            expected_conditions.element_to_be_clickable((By.CSS_SELECTOR, css))
        ).click()

    def log_in(self, username: str) -> None:
        self.driver.delete_all_cookies()
        self.open("/admin/login/")
        self.find("#id_username").send_keys(username)
        self.find("#id_password").send_keys(PASSWORD)
        self.click("input[type=submit]")
        self.find("#user-tools")

    def screenshot(self, name: str) -> Path:
        SCREENSHOTS_DIR.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS_DIR / f"{name}.png"
        # The whole page, not just the window: set the window to the document's height first.
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        self.driver.set_window_size(1280, min(max(height, 800), 6000))
        self.driver.save_screenshot(str(path))
        self.driver.set_window_size(1280, 900)
        return path

    def console_errors(self) -> list[str]:
        return [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]

    def broken_images(self) -> list[str]:
        return self.driver.execute_script(
            "return [...document.images].filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src.slice(0, 80))"
        )

    def assert_styled(self) -> None:
        """Fail when the admin's stylesheet did not load (the page would be raw HTML)."""
        colour = self.driver.execute_script(
            "return getComputedStyle(document.querySelector('#header')).backgroundColor"
        )
        assert colour not in ("rgba(0, 0, 0, 0)", "transparent"), "admin CSS did not load"


@pytest.fixture(scope="module")
def chromium(tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager never runs, so nothing is downloaded.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium, live_web, transactional_db) -> Browser:
    browser = Browser(chromium, live_web.base_url)
    chromium.get_log("browser")  # drop what earlier tests left
    return browser


@pytest.fixture
def admin_user(django_user_model):
    return django_user_model.objects.create_superuser("admin", "admin@example.com", PASSWORD)
