// The web chat page in headless Chromium: type a message, see a streamed reply, press stop.
import { chromium } from "playwright-core";
import assert from "node:assert/strict";

const base = process.argv[2];
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let passed = 0, failed = 0;
async function check(name, fn) {
  try { await fn(); passed++; console.log("ok", name); }
  catch (e) { failed++; console.log("FAIL", name, e.message); }
}
try {
  const page = await browser.newPage();
  const external = [];
  page.on("request", r => { if (!r.url().startsWith(base)) external.push(r.url()); });
  await page.goto(base + "/");
  await page.waitForFunction(() => !document.getElementById("model").textContent.includes("connecting"));

  await check("a typed message gets a streamed reply", async () => {
    await page.uncheck("#think");
    await page.fill("#maxtok", "40");
    await page.fill("#input", "plain-probe");
    await page.click("#send");
    await page.waitForSelector(".assistant[data-state=done]", { timeout: 30000 });
    const text = await page.textContent(".assistant .content");
    assert.equal(text, "Just the answer: 42.");
    assert.match(await page.textContent(".assistant .stats"), /tok\/s/);
  });

  await check("reasoning shows in a collapsible block", async () => {
    await page.check("#think");
    await page.fill("#maxtok", "200");
    await page.fill("#input", "think-probe");
    await page.click("#send");
    await page.waitForFunction(() => document.querySelectorAll(".assistant[data-state=done]").length === 2, null, { timeout: 30000 });
    const last = page.locator(".assistant").last();
    assert.equal(await last.locator("details.reasoning").count(), 1);
    assert.equal(await last.locator(".content").textContent(), "The answer is 42.");
  });

  await check("stop ends a long reply", async () => {
    await page.uncheck("#think");
    await page.fill("#maxtok", "1000");
    await page.fill("#input", "story-probe");
    await page.click("#send");
    await page.waitForFunction(() => {
      const a = [...document.querySelectorAll(".assistant")].pop();
      return a && a.dataset.state === "streaming" && a.querySelector(".content").textContent.length > 20;
    }, null, { timeout: 30000 });
    await page.click("#stop");
    await page.waitForFunction(() => [...document.querySelectorAll(".assistant")].pop().dataset.state === "stopped", null, { timeout: 10000 });
    assert.equal(await page.isDisabled("#send"), false);
    const text = await page.locator(".assistant .content").last().textContent();
    assert.ok(text.length < ("Once upon a time ".length * 60) - 1, "the reply was cut short");
  });

  await check("the conversation is kept in the page", async () => {
    assert.equal(await page.locator(".user").count(), 3);
  });

  await check("the page loads nothing from outside", async () => {
    assert.deepEqual(external, []);
  });
} finally {
  await browser.close();
}
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
