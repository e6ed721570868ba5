/** This package's version, naming its tracer and meter (a test checks that it matches package.json). */
export const VERSION = '0.1.0'
