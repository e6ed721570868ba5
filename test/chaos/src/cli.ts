/**
 * `pnpm chaos`: parses the options, runs the suite, prints the summary and the reproduce command, writes the
 * report. Exit codes: 0 pass, 1 violations, 2 bad usage or a run that could not complete, 3 a requested fault kind
 * never happened.
 */
import { dirname, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { type ChaosOptions, parseOptions, reproduceCommand, USAGE } from './options.js'
import { exitCode, formatSummary } from './report.js'
import { run } from './run.js'

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')

let options: ChaosOptions
try {
  // `pnpm chaos -- --seed 1` passes the `--` on; it only separates pnpm's arguments from ours.
  const argv = process.argv.slice(2)
  options = parseOptions(argv[0] === '--' ? argv.slice(1) : argv, root)
} catch (error) {
  console.error(`${(error as Error).message}\n\n${USAGE}`)
  process.exit(2)
}

console.log(`oncely chaos: seed ${options.seed}, run directory ${options.runDir}`)
console.log(`reproduce: ${reproduceCommand(options)}`)
try {
  const report = await run(options)
  console.log(formatSummary(report))
  console.log(`report: ${options.report}`)
  process.exit(exitCode(report))
} catch (error) {
  console.error(`the run could not complete: ${(error as Error).stack ?? error}`)
  console.error(`reproduce: ${reproduceCommand(options)}`)
  process.exit(2)
}
