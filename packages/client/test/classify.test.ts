import { expect, it } from 'vitest'
import { isFetchNetworkError } from '../src/classify.js'

const typeError = (message: string, cause?: unknown) => {
  const error = new TypeError(message, cause === undefined ? undefined : { cause })
  return error
}

it('recognises a failed fetch as every runtime words it', () => {
  expect(isFetchNetworkError(typeError('Failed to fetch'))).toBe(true) // Chrome
  expect(isFetchNetworkError(typeError('NetworkError when attempting to fetch resource.'))).toBe(true) // Firefox
  expect(isFetchNetworkError(typeError('Load failed'))).toBe(true) // Safari, even with a stack
  expect(isFetchNetworkError(typeError('fetch failed', { code: 'ECONNRESET' }))).toBe(true) // undici
  expect(isFetchNetworkError(typeError('Network request failed'))).toBe(true) // React Native
  expect(isFetchNetworkError(typeError('terminated'))).toBe(true) // undici, body cut off
  expect(isFetchNetworkError(Object.assign(new Error('socket hang up'), { code: 'UND_ERR_SOCKET' }))).toBe(
    true,
  )
  expect(isFetchNetworkError(new Error('other', { cause: { code: 'ECONNREFUSED' } }))).toBe(true)
})

it('does not mistake programming errors for network errors', () => {
  expect(isFetchNetworkError(typeError("Failed to execute 'fetch': Invalid name"))).toBe(false)
  expect(isFetchNetworkError(new RangeError('Failed to fetch'))).toBe(false)
  expect(isFetchNetworkError(new DOMException('The operation was aborted.', 'AbortError'))).toBe(false)
  expect(isFetchNetworkError('Failed to fetch')).toBe(false)
})
