// Says which React each browser project really runs, so the React 18 project cannot silently run React 19.
import { version } from 'react'
import { version as domVersion } from 'react-dom'
import { expect, it } from 'vitest'

it('runs the React of its project', ({ task }) => {
  const major = task.file.projectName?.startsWith('react 18') ? '18' : '19'
  expect(version.split('.')[0]).toBe(major)
  expect(domVersion).toBe(version)
})
