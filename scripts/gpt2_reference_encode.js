// The reference GPT-2 encoder (npm gpt-3-encoder) on a file: writes the token
// ids as little-endian uint16 to OUT. For the tests.
//   node scripts/gpt2_reference_encode.js PACKAGE_DIR INPUT OUT
//
// The package's encode() grows its result by concatenation, quadratic in the
// length of its input; so the text goes to it in pieces, cut after a newline
// that a non-whitespace character follows, where no GPT-2 pre-token can span
// the cut (tpsp cuts its own input the same way, in larger pieces).
const fs = require("fs");
const path = require("path");
const [packageDir, input, out] = process.argv.slice(2);
const { encode } = require(path.resolve(packageDir));
const text = fs.readFileSync(input, "utf-8");
const tokens = [];
let start = 0;
for (let i = 1; i <= text.length; i++) {
  if (i === text.length || (text[i - 1] === "\n" && !/\s/.test(text[i]))) {
    for (const t of encode(text.slice(start, i))) tokens.push(t);
    start = i;
  }
}
fs.writeFileSync(out, Buffer.from(Uint16Array.from(tokens).buffer));
