"""What every browser test checks on a page, at a desktop's width and at a phone's (issue 36).

The fixtures that start Chromium and serve the app live in tests/web/test_browser.py; these helpers
take the Playwright page they yield.
"""

from __future__ import annotations

DESKTOP = {"width": 1360, "height": 900}
PHONE = {"width": 400, "height": 860}

# Boxes wider than the viewport, and boxes that scroll or clip sideways with content hidden past their edge.
# A box of a pixel or two (the visually-hidden labels) hides nothing a person could read.
_OVERFLOWS = """() => {
  const width = window.innerWidth;
  const found = [];
  if (document.documentElement.scrollWidth > width) {
    found.push(`the page is ${document.documentElement.scrollWidth}px wide in a ${width}px viewport`);
  }
  for (const el of document.body.querySelectorAll('*')) {
    const style = getComputedStyle(el);
    if (style.display === 'none' || style.visibility === 'hidden') continue;
    const box = el.getBoundingClientRect();
    if (box.width <= 2 || box.height <= 2) continue;
    const name = el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
      (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
    if (box.right > width + 1) found.push(`${name} reaches ${Math.round(box.right)}px`);
    // A form field's text scrolls under its caret by design (a long URL being edited): not hidden content.
    if (['auto', 'scroll', 'hidden', 'clip'].includes(style.overflowX) && el.scrollWidth > el.clientWidth + 1 &&
        !['input', 'textarea', 'select'].includes(el.tagName.toLowerCase())) {
      found.push(`${name} hides ${el.scrollWidth - el.clientWidth}px of its content sideways`);
    }
  }
  return found;
}"""


def overflows(page) -> list[str]:
    """Everything on the page that is wider than the screen or hides part of itself sideways."""
    return page.evaluate(_OVERFLOWS)


def assert_fits(page) -> None:
    found = overflows(page)
    assert found == [], f"{page.url} at {page.viewport_size['width']}px: " + "; ".join(found[:10])


def assert_on_screen(locator) -> None:
    """The element is shown and lies wholly inside the viewport's width (a person can read it without scrolling
    sideways)."""
    locator.wait_for(state="visible")
    box = locator.bounding_box()
    width = locator.page.viewport_size["width"]
    assert box is not None and box["width"] > 0, f"{locator} is not laid out"
    assert box["x"] >= 0 and box["x"] + box["width"] <= width + 1, f"{locator} spans {box} in a {width}px viewport"


def sign_in(page, live_url: str, role: str) -> None:
    """Sign in through the form as one of the `users` fixture's people (their password is "pw-<role>")."""
    page.goto(live_url + "/login")
    page.fill("input[name=email]", f"{role}@example.com")
    page.fill("input[name=password]", f"pw-{role}")
    page.click("button[type=submit]")
    page.wait_for_load_state("load")
