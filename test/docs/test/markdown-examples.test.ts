// Every TypeScript example in the repository's Markdown is compiled under `strict` (as one project, the way a user's
// editor would see it) and run against the real services: a fresh Postgres database per example, and Redis and
// NATS when the example imports them. See src/snippets.ts for the directives that change what is done.
import { execFileSync, spawn } from 'node:child_process'
import { copyFileSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { accepts, createTestDatabase, freePort, optionalService, waitFor } from '@oncely/test-support'
import { describe, expect, it } from 'vitest'
import { extractSnippets, type Snippet } from '../src/snippets.js'

const root = path.resolve(import.meta.dirname, '../../..')
const workDir = path.resolve(import.meta.dirname, '../.snippets')
const RUN_TIMEOUT_MS = 60_000

const markdownFiles = execFileSync(
  'git',
  ['ls-files', '--cached', '--others', '--exclude-standard', '*.md'],
  {
    cwd: root,
    encoding: 'utf8',
  },
)
  .split('\n')
  // API reports (packages/*/api/*.api.md, written by API Extractor) are declarations to review, not examples to run.
  .filter((file) => file !== '' && !file.includes('node_modules/') && !file.endsWith('.api.md'))

const snippets: Snippet[] = markdownFiles.flatMap((file) =>
  extractSnippets(readFileSync(path.join(root, file), 'utf8'), file),
)
// The Express adapter serves Express 4 and 5, so every Express example that runs also runs under Express 4
// (installed here under the alias `express4`): the same program, importing `express4` where it imports `express`.
// These copies are run, not compiled (the types are Express 5's).
const EXPRESS_4_SUFFIX = '-express4'
const onExpress4: Snippet[] = snippets
  .filter((s) => (s.mode === 'run' || s.mode === 'server') && /from 'express'/.test(s.code))
  .map((s) => ({
    ...s,
    name: `${s.name}${EXPRESS_4_SUFFIX}`,
    code: s.code.replaceAll("from 'express'", "from 'express4'"),
  }))
const fileOf = (snippet: Snippet) => `${snippet.name}.${snippet.lang}`
// An example that names the transaction type of Fastify's routes (`declare module '@oncely/server/fastify' {
// interface Register { tx: ... } }`) changes it for the whole program it is compiled in, as it does in the reader's
// own project: it is compiled as a program of its own, and the others without it.
const augments = (snippet: Snippet) => /^declare module '@oncely\/server\/fastify'/m.test(snippet.code)
const ownPrograms = snippets.filter(augments)

rmSync(workDir, { recursive: true, force: true })
mkdirSync(workDir, { recursive: true })
writeFileSync(path.join(workDir, 'package.json'), `${JSON.stringify({ type: 'module' })}\n`)
// What a user's project would have: strict mode and Node's own module rules (the strictest about ESM imports), and
// the legacy decorators every NestJS project compiles with (the NestJS example's; no other example uses decorators).
writeFileSync(
  path.join(workDir, 'tsconfig.json'),
  `${JSON.stringify(
    {
      compilerOptions: {
        target: 'ES2022',
        lib: ['ES2022', 'DOM', 'DOM.Iterable'],
        module: 'NodeNext',
        moduleResolution: 'NodeNext',
        customConditions: ['@oncely/source'],
        types: ['node'],
        strict: true,
        jsx: 'react-jsx',
        skipLibCheck: true,
        experimentalDecorators: true,
        noEmit: true,
      },
      include: ['*.ts', '*.tsx'],
      exclude: [`*${EXPRESS_4_SUFFIX}.ts`, ...ownPrograms.map(fileOf)],
    },
    null,
    2,
  )}\n`,
)
for (const snippet of [...snippets, ...onExpress4])
  writeFileSync(path.join(workDir, fileOf(snippet)), snippet.code)
// Declarations of platform modules that examples import but Node cannot install (React Native): see ambient/.
const ambientDir = path.resolve(import.meta.dirname, '../ambient')
for (const file of readdirSync(ambientDir))
  copyFileSync(path.join(ambientDir, file), path.join(workDir, file))
// A Prisma example imports the client `prisma generate` makes from the schema shown in its Markdown: every ```prisma
// block is written to .snippets/prisma/ (a project's prisma/ folder, its `output` relative to it) and generated.
const prismaSchemas = markdownFiles.flatMap((file) =>
  [...readFileSync(path.join(root, file), 'utf8').matchAll(/^```prisma\n([\s\S]*?)^```/gm)].map(
    (block) => block[1] as string,
  ),
)
prismaSchemas.forEach((schema, i) => {
  const file = path.join(workDir, 'prisma', `schema-${i + 1}.prisma`)
  mkdirSync(path.dirname(file), { recursive: true })
  writeFileSync(file, schema)
  execFileSync(process.execPath, [path.join(root, 'scripts/prisma-generate.mjs'), file], {
    cwd: path.resolve(import.meta.dirname, '..'),
  })
})

/** Maps `.snippets/<name>.ts(line,col)` in compiler output back to the Markdown file and line. */
function toMarkdownLocations(output: string): string {
  return output.replace(
    /^([\w-]+)\.tsx?\((\d+),(\d+)\)/gm,
    (whole, name: string, line: string, col: string) => {
      const snippet = snippets.find((s) => s.name === name)
      return snippet ? `${snippet.file}:${snippet.line + Number(line) - 1}:${col}` : whole
    },
  )
}

/** Compiles a project of examples; resolves the compiler's errors, at their Markdown locations, or '' without any. */
function compile(project: string): string {
  const tsc = path.resolve(import.meta.dirname, '../node_modules/typescript/bin/tsc')
  try {
    execFileSync(process.execPath, [tsc, '-p', project], { cwd: workDir, encoding: 'utf8' })
    return ''
  } catch (error) {
    return toMarkdownLocations(String((error as { stdout?: string }).stdout ?? error))
  }
}

/** How many ports a server example gets, one after another, when the one it was given was taken meanwhile. */
const PORT_TRIES = 5

/** A server example exited because its port was taken between the pick and its listen(). */
class PortInUseError extends Error {}

/**
 * Runs one example as a user would (`node --import tsx`), with its services in the environment. A server example
 * listens on $PORT, a port that was free a moment ago: when something else took it first (EADDRINUSE), it runs
 * again on another.
 */
async function runSnippet(snippet: Snippet, env: NodeJS.ProcessEnv): Promise<void> {
  for (let tries = 1; ; tries++) {
    try {
      return await runOnce(snippet, env)
    } catch (error) {
      if (!(error instanceof PortInUseError) || tries >= PORT_TRIES) throw error
    }
  }
}

async function runOnce(snippet: Snippet, env: NodeJS.ProcessEnv): Promise<void> {
  const port = snippet.mode === 'server' ? await freePort() : undefined
  const child = spawn(process.execPath, ['--conditions=@oncely/source', '--import', 'tsx', fileOf(snippet)], {
    cwd: workDir,
    env: { ...env, ...(port ? { PORT: String(port) } : {}) },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let output = ''
  child.stdout.on('data', (chunk) => {
    output += chunk
  })
  child.stderr.on('data', (chunk) => {
    output += chunk
  })
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)))
  const where = `${snippet.file}:${snippet.line}`
  try {
    if (port !== undefined) {
      let code: number | null | undefined
      void exited.then((c) => {
        code = c
      })
      await waitFor(
        `${where} to listen on $PORT`,
        async () => code !== undefined || (await accepts(port)),
        30_000,
      )
      if (code !== undefined) {
        const message = `${where} exited with ${code} before listening:\n${output}`
        throw /EADDRINUSE/.test(output) ? new PortInUseError(message) : new Error(message)
      }
      return
    }
    const timeout = new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), RUN_TIMEOUT_MS))
    const code = await Promise.race([exited, timeout])
    if (code === 'timeout') throw new Error(`${where} did not finish within ${RUN_TIMEOUT_MS} ms:\n${output}`)
    if (code !== 0) throw new Error(`${where} exited with ${code}:\n${output}`)
  } finally {
    child.kill('SIGKILL')
  }
}

describe('Markdown examples', () => {
  it('finds examples (so an empty scan cannot pass)', () => {
    expect(snippets.length).toBeGreaterThan(0)
  })

  it('compile under strict as one project', () => {
    expect(compile(workDir), 'type errors in Markdown examples').toBe('')
  })

  it.each(ownPrograms.map((s) => [`${s.file}:${s.line}`, s] as const))(
    'compiles %s, which augments a module, as a program of its own',
    (_, snippet) => {
      const project = path.join(workDir, `tsconfig.${snippet.name}.json`)
      writeFileSync(
        project,
        JSON.stringify({ extends: './tsconfig.json', files: [fileOf(snippet)], include: [] }),
      )
      expect(compile(project), 'type errors in the Markdown example').toBe('')
    },
  )

  const compiledOnly = snippets.filter((s) => s.mode === 'compile-only')
  it.skipIf(compiledOnly.length === 0)('reports the examples that are only compiled', () => {
    for (const s of compiledOnly) console.info(`compiled, not run: ${s.file}:${s.line}: ${s.reason}`)
  })

  const runnable = snippets.filter((s) => s.mode === 'run' || s.mode === 'server')
  it('runs the Express examples under Express 4 as well (so the copies cannot be lost)', () => {
    expect(onExpress4.length).toBeGreaterThan(0)
  })
  it.each([
    ...runnable.map((s) => [`${s.file}:${s.line}`, s] as const),
    ...onExpress4.map((s) => [`${s.file}:${s.line} on Express 4`, s] as const),
  ])('runs %s', async (_, snippet) => {
    const env: NodeJS.ProcessEnv = { ...process.env }
    for (const [service, envName, defaultUrl, pattern] of [
      ['Redis', 'REDIS_URL', 'redis://127.0.0.1:6379', /from 'ioredis'/],
      ['NATS', 'NATS_URL', 'nats://127.0.0.1:4222', /from '@nats-io\//],
    ] as const) {
      if (!pattern.test(snippet.code)) continue
      const found = await optionalService(envName, defaultUrl)
      if (found.skip) {
        if (process.env.CI) throw new Error(`${service} is needed by this example: ${found.skip}`)
        console.info(`${snippet.file}:${snippet.line} not run: ${found.skip}`)
        return
      }
      env[envName] = found.url
    }
    const db = await createTestDatabase('docs')
    try {
      env.DATABASE_URL = db.url
      await runSnippet(snippet, env)
    } finally {
      await db.drop()
    }
  })
})
