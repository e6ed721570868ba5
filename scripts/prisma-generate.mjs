#!/usr/bin/env node
// Generates a Prisma client from a schema, for the tests and the docs examples that use Prisma (the generated code
// is not committed: it is made from the installed prisma, so it always matches @prisma/client).
//
//   node scripts/prisma-generate.mjs <schema.prisma>   # from the package whose node_modules has prisma
//
// Skipped when the client was already generated from the same schema by the same prisma version. `prisma generate`
// itself runs in WebAssembly, but the CLI first looks for its schema-engine binary (used by migrations only) and
// downloads it when it is missing; nothing can be downloaded here, so PRISMA_SCHEMA_ENGINE_BINARY points it at an
// existing file (node itself), which generate never runs. Several test runs may generate at once: each generates
// into a directory of its own and the first to finish moves it into place.
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  renameSync,
  rmSync,
  writeFileSync,
} from 'node:fs'
import { createRequire } from 'node:module'
import path from 'node:path'

const schemaArg = process.argv[2]
if (!schemaArg) {
  console.error('usage: node scripts/prisma-generate.mjs <schema.prisma>')
  process.exit(2)
}
const schema = path.resolve(schemaArg)
const text = readFileSync(schema, 'utf8')
const output = /^\s*output\s*=\s*"([^"]+)"/m.exec(text)?.[1]
if (!output) throw new Error(`${schemaArg}: the generator needs an \`output\` (where the client is written)`)
const target = path.resolve(path.dirname(schema), output)

const require = createRequire(path.join(process.cwd(), 'package.json'))
const cli = require.resolve('prisma/build/index.js')
const version = JSON.parse(readFileSync(require.resolve('prisma/package.json'), 'utf8')).version
const stamp = createHash('sha256').update(`${version}\n${text}`).digest('hex')
const stampFile = path.join(target, '.oncely-stamp')
const upToDate = () => existsSync(stampFile) && readFileSync(stampFile, 'utf8') === stamp
if (upToDate()) process.exit(0)

// The schema copied next to the target with the output pointing into a fresh directory of this run's.
mkdirSync(path.dirname(target), { recursive: true })
const work = mkdtempSync(`${target}.tmp-`)
try {
  const tmpSchema = path.join(work, 'schema.prisma')
  writeFileSync(
    tmpSchema,
    text.replace(/^(\s*output\s*=\s*)"[^"]+"/m, (_, head) => `${head}${JSON.stringify('./client')}`),
  )
  execFileSync(process.execPath, [cli, 'generate', '--schema', tmpSchema], {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: {
      ...process.env,
      PRISMA_SCHEMA_ENGINE_BINARY: process.execPath,
      CHECKPOINT_DISABLE: '1',
      PRISMA_HIDE_UPDATE_MESSAGE: '1',
    },
  })
  const generated = path.join(work, 'client')
  writeFileSync(path.join(generated, '.oncely-stamp'), stamp)
  if (upToDate()) process.exit(0)
  // An outdated client (another schema or prisma version) is replaced.
  if (existsSync(target)) rmSync(target, { recursive: true, force: true })
  try {
    renameSync(generated, target)
  } catch (error) {
    // Another run moved its client into place first: the same one, when its stamp matches.
    if (!upToDate()) cpSync(generated, target, { recursive: true, force: true })
    if (!upToDate()) throw error
  }
} finally {
  rmSync(work, { recursive: true, force: true })
}
