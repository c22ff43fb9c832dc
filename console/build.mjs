// build.mjs - bundle the usage console (src/) into one folder that
// scripts/embed_assets.sh embeds into the quotagate binary.
//
//   node console/build.mjs OUTDIR
//
// esbuild (from console/node_modules, installed by `npm ci` from the
// committed lockfile) bundles src/app.js with its imports (uPlot among
// them) and src/style.css with uPlot's stylesheet, minified, into files
// named with their content's hash; src/favicon.svg is copied under a
// hashed name too.  src/index.html is written last with those names in
// place of its {{app.js}}, {{style.css}} and {{favicon.svg}} marks, so
// that every file but index.html can be cached for good.  OUTDIR is
// emptied first: nothing stale is ever embedded.
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';

const HERE = dirname(fileURLToPath(import.meta.url));
const SRC = join(HERE, 'src');
const out = resolve(process.argv[2] || 'build/console');

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

const result = await esbuild.build({
  entryPoints: { app: join(SRC, 'app.js'), style: join(SRC, 'style.css') },
  bundle: true,
  minify: true,
  format: 'esm',
  target: ['chrome110', 'firefox110', 'safari16'],
  outdir: out,
  entryNames: '[name]-[hash]',
  metafile: true,
  logLevel: 'warning',
});

// the mark of each entry point -> the file esbuild wrote for it
const names = {};
for (const [file, meta] of Object.entries(result.metafile.outputs)) {
  if (!meta.entryPoint) continue;
  const entry = basename(meta.entryPoint);
  names[entry] = basename(file);
}

const icon = readFileSync(join(SRC, 'favicon.svg'));
const iconHash = createHash('sha256').update(icon).digest('hex').slice(0, 8);
names['favicon.svg'] = `favicon-${iconHash}.svg`;
writeFileSync(join(out, names['favicon.svg']), icon);

let html = readFileSync(join(SRC, 'index.html'), 'utf8');
html = html.replace(/\{\{([a-z.]+)\}\}/g, (m, key) => {
  if (!names[key]) throw new Error(`index.html: no built file for ${m}`);
  return names[key];
});
writeFileSync(join(out, 'index.html'), html);

for (const [k, v] of Object.entries(names)) console.log(`console: ${k} -> ${v}`);
