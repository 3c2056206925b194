/* What _native.c's module takes from its other source files. */
#ifndef SHMLOAD_NATIVE_H
#define SHMLOAD_NATIVE_H
#include <Python.h>

/* The most dimensions a shape the compiled core reads may have (numpy's own limit is 64). */
#define MAX_DIMS 32

/* _queue.c: adds QueueWriter and QueueReader to the module; -1 with an exception set. */
int add_queue_types(PyObject *module);

/* _views.c: adds views() to the module; -1 with an exception set. */
int add_view_functions(PyObject *module);

#endif
