// Drives serve's web view in a real headless Chromium (Debian's, through playwright-core) for
// tests/ui.rs. The test starts serve, makes the sessions, and talks to this script over
// stdio: this script prints `STEP <name>` when it waits at a point and reads one line from
// stdin to go on; it prints `OK <what>` as checks pass and exits non-zero on the first that
// fails. Screenshots go to $BROCA_UI_SHOTS.
//
// Environment: BROCA_UI_BASE (http://host:port), BROCA_UI_LINK (the one-time sign-in link),
// BROCA_UI_SHOTS (a folder), BROCA_CHROMIUM (the browser; default /usr/bin/chromium).
import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { mkdirSync } from "node:fs";

const base = process.env.BROCA_UI_BASE;
const link = process.env.BROCA_UI_LINK;
const shots = process.env.BROCA_UI_SHOTS;
const executablePath = process.env.BROCA_CHROMIUM || "/usr/bin/chromium";
const WAIT = 30_000;

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function step(name) {
  console.log(`STEP ${name}`);
  const next = await lines.next();
  if (next.done) throw new Error(`stdin closed at step ${name}`);
}

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
  console.log(`OK ${what}`);
}

async function shot(page, name) {
  await page.screenshot({ path: `${shots}/${name}.png`, fullPage: true });
}

/** The texts of every element matching `selector`. */
async function texts(page, selector) {
  return page.locator(selector).allTextContents();
}

async function main() {
  mkdirSync(shots, { recursive: true });
  const browser = await chromium.launch({ executablePath, headless: true, args: ["--no-sandbox"] });
  try {
    const context = await browser.newContext({ viewport: { width: 1400, height: 900 } });
    const page = await context.newPage();
    const consoleErrors = [];
    // Refused requests are logged by the browser as "Failed to load resource" (the unsigned
    // page, the refused send, a favicon): those are expected; anything else is not.
    page.on("console", (m) => {
      if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) consoleErrors.push(m.text());
    });
    page.on("pageerror", (e) => consoleErrors.push(String(e)));

    // Unsigned: the view says how to sign in and shows nothing else.
    let res = await page.goto(`${base}/ui`);
    check(res.status() === 401, "the view without a sign-in is 401");
    check((await page.content()).includes("broca ui"), "the unsigned page names `broca ui`");

    // The one-time link signs in and leaves nothing in the URL.
    await page.goto(link);
    await page.waitForURL(`${base}/ui`, { timeout: WAIT });
    check(page.url() === `${base}/ui`, "after the sign-in the URL carries no token");
    const cookies = await context.cookies();
    const c = cookies.find((k) => k.name === "broca_ui");
    check(c && c.httpOnly && c.sameSite === "Strict", "the sign-in cookie is HttpOnly and SameSite=Strict");
    check(!(await page.evaluate(() => document.cookie)).includes("broca_ui"), "the page's script cannot read the cookie");

    // Sessions and their last runs.
    await page.waitForSelector("#sessions tbody tr", { timeout: WAIT });
    const rows = await texts(page, "#sessions tbody tr");
    check(rows.some((r) => r.includes("done") && r.includes("completed")), "the completed session is listed with its state");
    check(rows.some((r) => r.includes("crashed") && r.includes("interrupted")), "the interrupted session is listed with its state");
    await shot(page, "1-sessions");

    // The interrupted run: its call of unknown outcome is marked, in the runs and the transcript.
    await page.locator("#sessions tbody tr", { hasText: "crashed" }).click();
    await page.waitForSelector("#runs tbody tr.has-unknown", { timeout: WAIT });
    const unknownCell = await page.locator("#runs tbody tr.has-unknown td.unknown-calls").textContent();
    check(unknownCell.includes("demo_1") && unknownCell.includes("not run again"), "the runs table names the call of unknown outcome");
    await page.waitForSelector("#transcript .call.indeterminate", { timeout: WAIT });
    const call = await page.locator("#transcript .call.indeterminate").first().textContent();
    check(call.includes("demo_word_count") && call.includes("outcome unknown"), "the transcript marks the call of unknown outcome");
    await shot(page, "2-interrupted");

    // A completed session: its tool call, its result, its usage.
    await page.locator("#sessions tbody tr", { hasText: "done" }).click();
    await page.waitForFunction(() => document.querySelector("#session-title").textContent === "done", null, { timeout: WAIT });
    await page.waitForSelector("#transcript .result", { timeout: WAIT });
    const transcript = (await texts(page, "#transcript > li")).join("\n");
    check(transcript.includes("demo_word_count") && transcript.includes("3 words"), "the transcript shows the tool call and its result");
    const runRow = await page.locator("#runs tbody tr").first().textContent();
    check(runRow.includes("completed") && runRow.includes("demo/tour") && runRow.includes(" / 90"), "the run shows its state, model and usage");
    await shot(page, "3-transcript");

    // Read-only: the sign-in cannot send.
    const refused = await page.evaluate(async () => {
      const r = await fetch("/v1/rpc", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ method: "session.send", params: { project_root: "/demo", harness: "cli", session: "done", prompt: "x", model: "demo/tour" } }),
      });
      return { status: r.status, body: await r.json() };
    });
    check(refused.status === 403 && refused.body.error.code === "forbidden", "a send from the view is refused 403 forbidden");

    // Live: a run sent elsewhere streams into the open view.
    await page.waitForFunction(() => document.querySelector("#live-state").textContent === "live", null, { timeout: WAIT });
    await page.evaluate(() => {
      window.__seen = "";
      new MutationObserver(() => {
        const t = document.querySelector("#live-text").textContent;
        if (t.length > 0) window.__seen += `|${t}`;
      }).observe(document.querySelector("#live-text"), { childList: true, characterData: true, subtree: true });
    });
    await step("live");
    const finished = (n) => [...document.querySelectorAll("#live-events li")].filter((li) => li.textContent.includes("finished: completed")).length >= n;
    await page.waitForFunction(finished, 1, { timeout: WAIT });
    check((await page.evaluate(() => window.__seen)).includes("Hello from"), "the answer's text streamed into the view as it came");
    await page.waitForFunction(() => document.querySelector("#transcript").textContent.includes("4 words"), null, { timeout: WAIT });
    check(true, "the live run's messages joined the transcript");
    await shot(page, "4-live");

    // serve restarts; a run happens while the view is away; the view catches up from its
    // cursor, with nothing twice.
    await step("restart");
    await page.waitForFunction(finished, 2, { timeout: WAIT });
    await page.waitForFunction(() => document.querySelector("#live-state").textContent === "live", null, { timeout: WAIT });
    const events = await texts(page, "#live-events li");
    const started = events.filter((t) => t.includes("started (")).length;
    const done = events.filter((t) => t.includes("finished: completed")).length;
    check(started === 2 && done === 2, `after the restart the view caught up with each run once (started ${started}, finished ${done})`);
    await page.waitForFunction(() => document.querySelector("#transcript").textContent.includes("2 words"), null, { timeout: WAIT });
    check(true, "the run made while the view was away is in the transcript");
    await shot(page, "5-reconnected");

    // Signing out ends the sign-in.
    await page.click("#sign-out");
    await page.waitForFunction(() => document.querySelector("#notice").textContent.includes("Signed out"), null, { timeout: WAIT });
    const after = await page.evaluate(async () => (await fetch("/v1/rpc", { method: "POST", body: JSON.stringify({ method: "sessions.list", params: {} }) })).status);
    check(after === 401, "after signing out the surface answers 401");
    check(consoleErrors.length === 0, `no script errors in the page (${consoleErrors.join(" | ")})`);
  } finally {
    await browser.close();
  }
}

main().then(
  () => { console.log("DONE"); process.exit(0); },
  (e) => { console.log(`FAIL ${e.stack || e}`); process.exit(1); },
);
