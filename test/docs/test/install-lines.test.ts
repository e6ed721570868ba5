// A reader installs what a README's install lines say, then pastes its examples. Under pnpm's strict node_modules a
// package the lines leave out is not found (ERR_MODULE_NOT_FOUND), although this workspace, which has them all,
// would run the example: so every oncely package an example imports must be installed by its README's lines.
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { extractSnippets } from '../src/snippets.js'

const root = path.resolve(import.meta.dirname, '../../..')
const readmes = execFileSync(
  'git',
  ['ls-files', '--cached', '--others', '--exclude-standard', '*README.md'],
  {
    cwd: root,
    encoding: 'utf8',
  },
)
  .split('\n')
  .filter((file) => file !== '' && !file.includes('node_modules/'))

/** The packages a Markdown file's shell blocks install (`pnpm add a b`, `npm install a`). */
function installed(markdown: string): Set<string> {
  const names = new Set<string>()
  for (const block of markdown.matchAll(/^```(?:sh|bash|shell)\n([\s\S]*?)^```/gm)) {
    for (const line of (block[1] ?? '').split('\n')) {
      const command = /^\s*(?:pnpm add|npm install|npm i|yarn add)\s+([^#]*)/.exec(line)
      for (const word of command?.[1]?.split(/\s+/) ?? []) if (word && !word.startsWith('-')) names.add(word)
    }
  }
  return names
}

/** The oncely packages an example imports (`@oncely/server/fastify` is `@oncely/server`). */
function oncelyImports(code: string): Set<string> {
  const names = new Set<string>()
  for (const match of code.matchAll(/\bfrom\s+['"](@oncely\/[^/'"]+)/g)) names.add(match[1] as string)
  return names
}

const withInstallLines = readmes.filter(
  (file) => installed(readFileSync(path.join(root, file), 'utf8')).size > 0,
)

describe('install lines', () => {
  it('are found (so an empty scan cannot pass)', () => {
    expect(withInstallLines).toContain('packages/server/README.md')
  })

  it.each(withInstallLines)('%s installs every oncely package its examples import', (file) => {
    const markdown = readFileSync(path.join(root, file), 'utf8')
    const have = installed(markdown)
    const missing = extractSnippets(markdown, file).flatMap((snippet) =>
      [...oncelyImports(snippet.code)]
        .filter((name) => !have.has(name))
        .map((name) => `${file}:${snippet.line} imports ${name}`),
    )
    expect(missing).toEqual([])
  })
})
