// Finds the TypeScript examples in Markdown. Every ```ts or ```tsx block is an example a reader may paste, so by
// default each one is compiled under `strict` and run to completion against real services. A directive on the
// line before the fence (an HTML comment, invisible on GitHub) changes that, and must say why:
//
//   <!-- snippet: server -->                      runs until it listens on $PORT, then is stopped
//   <!-- snippet: compile-only: <reason> -->      compiled, not run (browser or React Native code)
//
// There is no way to skip an example: one that cannot run in Node is compiled at least.

/** What the harness does with one example. */
export type SnippetMode = 'run' | 'server' | 'compile-only'

export interface Snippet {
  /** The Markdown file, relative to the repository root. */
  file: string
  /** The 1-based line of the first line of code (the one after the fence). */
  line: number
  lang: 'ts' | 'tsx'
  code: string
  mode: SnippetMode
  /** Why the example is not run (compile-only). */
  reason?: string
  /** A file-system-safe unique name, such as `packages-server-README-L14`. */
  name: string
}

const FENCE = /^(\s*)(`{3,}|~{3,})\s*([\w+-]*)/
const DIRECTIVE = /^<!--\s*snippet:\s*([\w-]+)\s*(?::\s*(.*?))?\s*-->$/

/** Parses a directive comment, or throws naming the file and line when it is malformed. */
function parseDirective(text: string, where: string): { mode: SnippetMode; reason?: string } {
  const match = DIRECTIVE.exec(text.trim())
  if (!match) throw new Error(`${where}: malformed snippet directive ${JSON.stringify(text.trim())}`)
  const mode = match[1] as SnippetMode
  const reason = match[2]?.trim() || undefined
  if (mode === 'run' || mode === 'server') return { mode }
  if (mode === 'compile-only') {
    if (!reason) throw new Error(`${where}: \`snippet: ${mode}\` needs a reason after a colon`)
    return { mode, reason }
  }
  throw new Error(
    `${where}: unknown snippet mode ${JSON.stringify(mode)} (run, server, compile-only or skip)`,
  )
}

/** Extracts the TypeScript examples of one Markdown file. */
export function extractSnippets(markdown: string, file: string): Snippet[] {
  const lines = markdown.split('\n')
  const snippets: Snippet[] = []
  const slug = file.replace(/\.md$/i, '').replace(/[^A-Za-z0-9]+/g, '-')
  for (let i = 0; i < lines.length; i++) {
    const open = FENCE.exec(lines[i] ?? '')
    if (!open) continue
    const [, indent = '', fence = '```', info = ''] = open
    // Find the closing fence (same character, at least as long) whatever the language, so code inside other blocks
    // is never mistaken for an example.
    let end = i + 1
    while (end < lines.length) {
      const close = FENCE.exec(lines[end] ?? '')
      if (close && close[2]?.[0] === fence[0] && (close[2]?.length ?? 0) >= fence.length && !close[3]) break
      end++
    }
    const lang = info.toLowerCase()
    if (lang === 'ts' || lang === 'typescript' || lang === 'tsx') {
      let previous = i - 1
      while (previous >= 0 && (lines[previous] ?? '').trim() === '') previous--
      const before = (lines[previous] ?? '').trim()
      const where = `${file}:${previous + 1}`
      const directive = before.startsWith('<!-- snippet')
        ? parseDirective(before, where)
        : { mode: 'run' as const }
      const code = lines
        .slice(i + 1, end)
        .map((line) => (line.startsWith(indent) ? line.slice(indent.length) : line))
        .join('\n')
      snippets.push({
        file,
        line: i + 2,
        lang: lang === 'tsx' ? 'tsx' : 'ts',
        code: `${code}\n`,
        ...directive,
        name: `${slug}-L${i + 2}`,
      })
    }
    i = end
  }
  return snippets
}
