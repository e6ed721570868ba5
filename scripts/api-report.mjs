#!/usr/bin/env node
// The public API of every published entry point, as API Extractor reports it from the built `.d.ts` files: one
// `api/<entry>.api.md` per entry point, checked in, so a change to the public API shows in review.
//
//   node scripts/api-report.mjs            # check: fails when a report differs from the built API (run after build)
//   node scripts/api-report.mjs --update   # rewrite the reports
//
// A report that lists a name tagged `@deprecated`, or an entry point meant for tests only, fails the check: the API
// of 1.0 carries neither.
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { CompilerState, Extractor, ExtractorConfig } from '@microsoft/api-extractor'

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const update = process.argv.includes('--update')
const packages = ['protocol', 'client', 'server', 'react']
// Entry points for tests and chaos runs only: they are published for them, and kept out of the API reports.
const TEST_ONLY = new Set(['@oncely/server/testing'])

const work = mkdtempSync(path.join(os.tmpdir(), 'oncely-api-'))
const problems = []
try {
  for (const name of packages) {
    const dir = path.join(root, 'packages', name)
    const manifest = JSON.parse(readFileSync(path.join(dir, 'package.json'), 'utf8'))
    const reports = path.join(dir, 'api')
    mkdirSync(reports, { recursive: true })
    const configs = []
    for (const [subpath, target] of Object.entries(manifest.exports)) {
      if (subpath === './package.json' || subpath.includes('*')) continue
      const entry = subpath === '.' ? manifest.name : `${manifest.name}/${subpath.slice(2)}`
      if (TEST_ONLY.has(entry)) continue
      const types = target.import?.types
      if (!types) continue
      const file = subpath === '.' ? 'index' : subpath.slice(2).replaceAll('/', '-')
      const config = ExtractorConfig.prepare({
        configObject: {
          projectFolder: dir,
          mainEntryPointFilePath: path.join(dir, types),
          compiler: { overrideTsconfig: { compilerOptions: { lib: ['ES2022', 'DOM'], types: ['node'] } } },
          apiReport: { enabled: true, reportFolder: reports, reportTempFolder: work, reportFileName: file },
          docModel: { enabled: false },
          dtsRollup: { enabled: false },
          tsdocMetadata: { enabled: false },
          messages: {
            compilerMessageReporting: { default: { logLevel: 'none' } },
            extractorMessageReporting: { default: { logLevel: 'none' } },
            tsdocMessageReporting: { default: { logLevel: 'none' } },
          },
        },
        configObjectFullPath: path.join(dir, 'api-extractor.json'),
        packageJsonFullPath: path.join(dir, 'package.json'),
      })
      configs.push({ entry, reportName: `${file}.api.md`, config })
    }
    if (configs.length === 0) continue
    // One TypeScript program for every entry point of the package (one per entry took minutes).
    const compilerState = CompilerState.create(configs[0].config, {
      additionalEntryPoints: configs.map(({ config }) => config.mainEntryPointFilePath),
    })
    for (const { entry, reportName, config } of configs) {
      const result = Extractor.invoke(config, {
        localBuild: update,
        showVerboseMessages: false,
        compilerState,
      })
      const report = path.join(reports, reportName)
      if (!result.apiReportChanged && existsSync(report)) {
        const text = readFileSync(report, 'utf8')
        if (/@deprecated/.test(text)) problems.push(`${entry}: lists a deprecated name (api/${reportName})`)
        continue
      }
      if (update) continue
      problems.push(
        `${entry}: its public API differs from packages/${name}/api/${reportName}; review the change, then run \`node scripts/api-report.mjs --update\` and commit the report`,
      )
    }
  }
} finally {
  rmSync(work, { recursive: true, force: true })
}
if (problems.length > 0) {
  console.error(`api-report: ${problems.length} problem(s):\n${problems.map((p) => `- ${p}`).join('\n')}`)
  process.exit(1)
}
console.log(update ? 'api-report: reports written' : 'api-report: every public API matches its report')
