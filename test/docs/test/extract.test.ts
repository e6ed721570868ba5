import { describe, expect, it } from 'vitest'
import { extractSnippets } from '../src/snippets.js'

const md = (...lines: string[]) => lines.join('\n')

describe('extractSnippets', () => {
  it('takes ts and tsx blocks, with the line of their first line of code, and ignores other languages', () => {
    const found = extractSnippets(
      md('# T', '```ts', 'const a = 1', '```', '', '```sh', 'echo', '```', '```tsx', 'const b = <p/>', '```'),
      'docs/x.md',
    )
    expect(found.map((s) => [s.lang, s.line, s.code, s.mode, s.name])).toEqual([
      ['ts', 3, 'const a = 1\n', 'run', 'docs-x-L3'],
      ['tsx', 10, 'const b = <p/>\n', 'run', 'docs-x-L10'],
    ])
  })

  it('reads the directive on the line before the fence, blank lines allowed', () => {
    const found = extractSnippets(
      md(
        '<!-- snippet: server -->',
        '```ts',
        'a',
        '```',
        '<!-- snippet: compile-only: runs in a browser -->',
        '',
        '```ts',
        'b',
        '```',
      ),
      'R.md',
    )
    expect(found.map((s) => [s.mode, s.reason])).toEqual([
      ['server', undefined],
      ['compile-only', 'runs in a browser'],
    ])
  })

  it('does not mistake a ts fence inside another block for an example', () => {
    expect(extractSnippets(md('````md', '```ts', 'x', '```', '````'), 'R.md')).toEqual([])
  })

  it('refuses a directive without a reason, an unknown one, or a skip, naming the file and line', () => {
    expect(() => extractSnippets(md('<!-- snippet: compile-only -->', '```ts', 'x', '```'), 'R.md')).toThrow(
      'R.md:1: `snippet: compile-only` needs a reason',
    )
    expect(() => extractSnippets(md('<!-- snippet: skip: later -->', '```ts', 'x', '```'), 'R.md')).toThrow(
      'unknown snippet mode "skip"',
    )
    expect(() => extractSnippets(md('<!-- snippet: maybe -->', '```ts', 'x', '```'), 'R.md')).toThrow(
      'unknown snippet mode "maybe"',
    )
  })
})
