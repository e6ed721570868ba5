#!/usr/bin/env node
// Packaging check: fails when a published package is broken for its users.
//
// For each public package: publint on the package, `pnpm pack` (which rewrites workspace: ranges), attw on the
// tarball, then the tarballs are installed together into a fresh ESM project and a fresh CJS project, and every
// entry point of every `exports` map is imported there (import() in ESM, require() in CJS).
import { execFileSync } from 'node:child_process'
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const packages = ['protocol', 'client', 'server', 'react'].map((name) => path.join(root, 'packages', name))
const bin = (name) => path.join(root, 'node_modules', '.bin', name)
const run = (command, args, options = {}) => execFileSync(command, args, { stdio: 'inherit', ...options })

const work = mkdtempSync(path.join(os.tmpdir(), 'oncely-pack-'))
let failed = false
try {
  const tarballs = []
  const entries = []
  // Peers are what a user installs next to the package: optional ones (fastify, ioredis, NATS) to use the matching
  // subpath, React for @oncely/react.
  const peers = new Set()
  for (const dir of packages) {
    const manifest = JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8'))
    for (const [name, range] of Object.entries(manifest.peerDependencies ?? {})) peers.add(`${name}@${range}`)
    console.log(`\n== ${manifest.name}`)
    run(bin('publint'), ['--strict'], { cwd: dir })
    const before = new Set(readdirSync(work))
    run('pnpm', ['pack', '--pack-destination', work], { cwd: dir, stdio: ['ignore', 'ignore', 'inherit'] })
    const tarball = readdirSync(work).find((file) => file.endsWith('.tgz') && !before.has(file))
    if (!tarball) throw new Error(`pnpm pack produced no tarball for ${manifest.name}`)
    tarballs.push(path.join(work, tarball))
    // Subpath exports that are not code (package.json, raw SQL files) are not import targets.
    for (const subpath of Object.keys(manifest.exports)) {
      if (subpath === './package.json' || subpath.includes('*')) continue
      entries.push(subpath === '.' ? manifest.name : `${manifest.name}/${subpath.slice(2)}`)
    }
    try {
      run(bin('attw'), [path.join(work, tarball), '--profile', 'node16', '--format', 'table-flipped'])
    } catch {
      failed = true
    }
  }

  for (const kind of ['esm', 'cjs']) {
    const project = path.join(work, `consumer-${kind}`)
    mkdirSync(project)
    writeFileSync(
      path.join(project, 'package.json'),
      JSON.stringify({
        name: `consumer-${kind}`,
        private: true,
        type: kind === 'esm' ? 'module' : 'commonjs',
      }),
    )
    console.log(`\n== installing the tarballs into a fresh ${kind.toUpperCase()} project`)
    run('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', ...tarballs, ...peers], {
      cwd: project,
    })
    const lines = entries.map((entry) =>
      kind === 'esm'
        ? `{ const m = await import(${JSON.stringify(entry)}); if (!Object.keys(m).length) throw new Error('empty: ${entry}'); console.log('import ok', ${JSON.stringify(entry)}, Object.keys(m).length) }`
        : `{ const m = require(${JSON.stringify(entry)}); if (!Object.keys(m).length) throw new Error('empty: ${entry}'); console.log('require ok', ${JSON.stringify(entry)}, Object.keys(m).length) }`,
    )
    const file = path.join(project, kind === 'esm' ? 'check.mjs' : 'check.cjs')
    writeFileSync(file, lines.join('\n'))
    try {
      run(process.execPath, [file], { cwd: project })
    } catch {
      failed = true
    }
  }
} finally {
  rmSync(work, { recursive: true, force: true })
}
if (failed) {
  console.error('\ncheck-packages: FAILED (see above)')
  process.exit(1)
}
console.log('\ncheck-packages: all packages pass publint, attw and fresh ESM/CJS installs')
