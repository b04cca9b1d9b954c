// Runs a TypeScript verification snippet exactly as published: transpile with the real
// TypeScript compiler, import it, call the named function on each case from stdin (JSON).
import ts from "typescript";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [snippetPath, functionName] = process.argv.slice(2);
const cases = JSON.parse(readFileSync(0, "utf8"));
const { outputText } = ts.transpileModule(readFileSync(snippetPath, "utf8"), {
  compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
});
const file = join(mkdtempSync(join(tmpdir(), "promesa-snippet-")), "snippet.mjs");
writeFileSync(file, outputText);
const snippet = await import(pathToFileURL(file).href);
const results = cases.map((c) => snippet[functionName](Buffer.from(c.body_b64, "base64"), c.signature, c.secret, c.now));
console.log(JSON.stringify(results));
