import { createHmac, timingSafeEqual } from "node:crypto";

const TOLERANCE_SECONDS = 300;

/**
 * True when X-Signature is valid for these exact body bytes and recent enough.
 * rawBody: the request body exactly as received (never re-serialised JSON).
 * header:  the X-Signature header, "t=<unix>,v1=<hex>[,v1=<hex>...]".
 * secret:  the subscription's whole secret string, "whsec_...".
 */
export function verifyPromesaSignature(
  rawBody: Buffer,
  header: string,
  secret: string,
  now: number = Date.now() / 1000,
): boolean {
  const pairs = header.split(",").map((item): [string, string] => {
    const at = item.indexOf("=");
    return at < 0 ? [item, ""] : [item.slice(0, at), item.slice(at + 1)];
  });
  const t = pairs.find(([key]) => key === "t")?.[1] ?? "";
  if (!/^\d+$/.test(t)) return false;
  const timestamp = Number(t);
  if (Math.abs(now - timestamp) > TOLERANCE_SECONDS) return false; // too old (a replay) or from the future
  const expected = createHmac("sha256", Buffer.from(secret, "utf8"))
    .update(Buffer.concat([Buffer.from(`${timestamp}.`, "utf8"), rawBody]))
    .digest();
  return pairs
    .filter(([key]) => key === "v1")
    .some(([, value]) => {
      const candidate = Buffer.from(value, "hex");
      return candidate.length === expected.length && timingSafeEqual(candidate, expected);
    });
}
