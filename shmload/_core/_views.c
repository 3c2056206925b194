/* The main process's views of a delivered batch, in C: the arrays of layout.views_in.
 *
 * views(leaves, owner) -> list | None. ``leaves`` is a layout's recipe (layout._recipe):
 * one (shape, value, offset) triple per leaf. An array leaf (shape a tuple, offset >= 0)
 * becomes what np.ndarray(shape, value, owner, offset) makes: a C-contiguous array of
 * dtype ``value`` over the owner's bytes from ``offset``, whose base is the owner, as
 * writeable as the owner; any other leaf (shape None) is its value itself.
 *
 * Like every function of the compiled core it may decline (None), having made nothing,
 * and the Python list comprehension then runs: for an owner that is not a 1-D C-contiguous
 * uint8 ndarray, a zero-size leaf (offset -1, which Python makes from ``owner[:0]``), a
 * value that is not a dtype, a shape that is not a tuple of non-negative ints, and a
 * leaf reaching past the owner's end (np.ndarray raises its own error there, and so the
 * Python code raises it). So nothing is ever made outside the owner's bytes, and the
 * arrays and errors are those of the Python code.
 *
 * Why the base is the owner, as np.ndarray makes it: numpy collapses a new array's base
 * through arrays that do not own their data only while the next base is an ndarray, and
 * the owner's base is the segment's mapping, so it stops at the owner (lifetime.py:
 * the owner dies exactly when the last view does).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define NO_IMPORT_ARRAY
#define PY_ARRAY_UNIQUE_SYMBOL shmload_ARRAY_API
#include <numpy/arrayobject.h>

#include "_native.h"

#if NPY_ABI_VERSION < 0x02000000 /* (built against numpy 1.x headers: the field itself) */
#define PyDataType_ELSIZE(descr) ((descr)->elsize)
#endif

/* A leaf's dims and byte count into dims/nbytes: its number of dimensions, or -1
 * to decline (not a shape of non-negative ints, too many dims, a size that overflows). */
static int
leaf_dims(PyObject *shape, PyArray_Descr *dtype, npy_intp *dims, npy_intp *nbytes)
{
    if (!PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) > MAX_DIMS)
        return -1;
    int nd = (int)PyTuple_GET_SIZE(shape);
    npy_intp total = PyDataType_ELSIZE(dtype);
    for (int d = 0; d < nd; d++) {
        PyObject *item = PyTuple_GET_ITEM(shape, d);
        if (!PyLong_CheckExact(item))
            return -1;
        Py_ssize_t n = PyLong_AsSsize_t(item);
        if (n < 0) {
            PyErr_Clear();
            return -1;
        }
        dims[d] = n;
        if (__builtin_mul_overflow(total, (npy_intp)n, &total))
            return -1;
    }
    *nbytes = total;
    return nd;
}

/* One array leaf over ``owner``; NULL with an exception, or Py_None (a new reference) to
 * decline. */
static PyObject *
leaf_view(PyArrayObject *owner, PyObject *shape, PyObject *value, PyObject *offset_obj)
{
    if (!PyArray_DescrCheck(value) || !PyLong_CheckExact(offset_obj))
        Py_RETURN_NONE;
    PyArray_Descr *dtype = (PyArray_Descr *)value;
    Py_ssize_t offset = PyLong_AsSsize_t(offset_obj);
    if (offset < 0) {
        PyErr_Clear();
        Py_RETURN_NONE; /* a zero-size leaf (-1), or an offset beyond any size */
    }
    npy_intp dims[MAX_DIMS], nbytes = 0;
    int nd = leaf_dims(shape, dtype, dims, &nbytes);
    npy_intp size = PyArray_NBYTES(owner);
    if (nd < 0 || offset > size || nbytes > size - offset)
        Py_RETURN_NONE; /* (checked before anything is made: no view reaches past the owner) */
    Py_INCREF(dtype); /* (stolen by NewFromDescr, even when it fails) */
    PyObject *array = PyArray_NewFromDescr(&PyArray_Type, dtype, nd, dims, NULL, PyArray_BYTES(owner) + offset,
                                           PyArray_ISWRITEABLE(owner) ? NPY_ARRAY_WRITEABLE : 0, NULL);
    if (array == NULL)
        return NULL;
    Py_INCREF(owner);
    if (PyArray_SetBaseObject((PyArrayObject *)array, (PyObject *)owner) < 0) { /* (steals the owner) */
        Py_DECREF(array);
        return NULL;
    }
    return array;
}

static PyObject *
views(PyObject *self, PyObject *args)
{
    PyObject *leaves;
    PyArrayObject *owner;
    if (!PyArg_ParseTuple(args, "O!O!:views", &PyTuple_Type, &leaves, &PyArray_Type, &owner))
        return NULL;
    if (PyArray_NDIM(owner) != 1 || PyArray_TYPE(owner) != NPY_UINT8 || !PyArray_IS_C_CONTIGUOUS(owner))
        Py_RETURN_NONE;
    Py_ssize_t n = PyTuple_GET_SIZE(leaves);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PyTuple_GET_ITEM(leaves, i), *item;
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3)
            goto decline;
        PyObject *shape = PyTuple_GET_ITEM(entry, 0), *value = PyTuple_GET_ITEM(entry, 1);
        if (shape == Py_None) {
            Py_INCREF(value);
            item = value;
        }
        else {
            item = leaf_view(owner, shape, value, PyTuple_GET_ITEM(entry, 2));
            if (item == NULL) {
                Py_DECREF(out); /* (a partly filled list is freed whole: its NULLs are skipped) */
                return NULL;
            }
            if (item == Py_None) {
                Py_DECREF(item);
                goto decline;
            }
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
decline:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

static PyMethodDef view_methods[] = {
    {"views", views, METH_VARARGS,
     "views(leaves, owner) -> list | None: layout.views_in's values, or None to decline."},
    {NULL, NULL, 0, NULL},
};

int
add_view_functions(PyObject *module)
{
    return PyModule_AddFunctions(module, view_methods);
}
