// A new, empty PGlite database for a test file, started from a copy of a freshly initialised data directory rather
// than by running initdb again. initdb in WebAssembly costs about 7 s of CPU (about 2 s to load the copy), and on a
// machine running two suites at once a test file's hook spent over a minute creating it. The copy is made once per
// PGlite version, in the OS temp directory, and written under a temporary name then renamed, so a concurrent test
// file never reads half of one: a file that finds none makes its own.
import { randomUUID } from 'node:crypto'
import { readFileSync, renameSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import { PGlite } from '@electric-sql/pglite'

// The package exports no package.json: read it beside its entry point (dist/index.cjs).
const entry = createRequire(import.meta.url).resolve('@electric-sql/pglite')
const { version } = JSON.parse(readFileSync(join(dirname(entry), '..', 'package.json'), 'utf8')) as {
  version: string
}
const copy = join(tmpdir(), `oncely-test-pglite-${version}-empty.tar.gz`)

/** An in-memory PGlite database with nothing in it, as `PGlite.create()` makes one. */
export async function freshPGlite(): Promise<PGlite> {
  let saved: Uint8Array<ArrayBuffer> | undefined
  try {
    saved = new Uint8Array(readFileSync(copy))
  } catch {
    // Not made yet (or no longer there): made below.
  }
  if (saved) return PGlite.create({ loadDataDir: new Blob([saved]) })
  const db = await PGlite.create()
  const dump = Buffer.from(await (await db.dumpDataDir('gzip')).arrayBuffer())
  const partial = `${copy}.${randomUUID()}`
  writeFileSync(partial, dump)
  renameSync(partial, copy)
  return db
}
