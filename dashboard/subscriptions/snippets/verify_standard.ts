import { createHmac, timingSafeEqual } from "node:crypto";

const TOLERANCE_SECONDS = 300;

/**
 * True when the Standard Webhooks headers are valid for these exact body bytes.
 * headers: webhook-id, webhook-timestamp, webhook-signature ("v1,<base64>" entries, space-separated).
 * secret:  the subscription's secret, "whsec_<base64>"; the key is the decoded base64 part.
 */
export function verifyStandardWebhook(
  rawBody: Buffer,
  headers: Record<string, string>,
  secret: string,
  now: number = Date.now() / 1000,
): boolean {
  const lower: Record<string, string> = {};
  for (const [key, value] of Object.entries(headers)) lower[key.toLowerCase()] = value;
  const msgId = lower["webhook-id"] ?? "";
  const timestamp = lower["webhook-timestamp"] ?? "";
  if (!msgId || !/^\d+$/.test(timestamp)) return false;
  if (Math.abs(now - Number(timestamp)) > TOLERANCE_SECONDS) return false; // too old (a replay) or from the future
  const key = Buffer.from(secret.replace(/^whsec_/, ""), "base64");
  const expected = createHmac("sha256", key)
    .update(Buffer.concat([Buffer.from(`${msgId}.${timestamp}.`, "utf8"), rawBody]))
    .digest();
  return (lower["webhook-signature"] ?? "").split(" ").some((entry) => {
    const [version, signature] = entry.split(",", 2);
    if (version !== "v1" || !signature) return false;
    const candidate = Buffer.from(signature, "base64");
    return candidate.length === expected.length && timingSafeEqual(candidate, expected);
  });
}
